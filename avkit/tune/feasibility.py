"""Does a batch fit? KV cache for `concurrency` requests of `context` tokens next to both models' weights:
  fits(c) = c context kv_bytes_per_token <= utilization memory - weights(target + drafter)
kv_bytes_per_token: target's + drafter's 2 layers kv_heads head_dim bytes. The numbers come from the cost
table's meta (roofline, or `avkit profile`'s record), else its model names in the roofline's shapes;
`--memory-gb` overrides the memory. Activations and graphs are left to the utilization headroom.
"""

from __future__ import annotations

from dataclasses import dataclass

from avkit.scheduling.cost import CostTable
from avkit.scheduling.roofline import MODELS

DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0}


@dataclass(frozen=True)
class MemoryBudget:
    memory_gb: float  # device memory, 1e9 bytes
    weights_gb: float  # target + drafter weights
    kv_bytes_per_token: float  # target + drafter, per context token
    utilization: float
    source: str  # where the numbers came from

    @property
    def kv_tokens(self) -> int:
        """Context tokens the KV pool holds (0 when the weights alone do not fit)."""
        free = (self.utilization * self.memory_gb - self.weights_gb) * 1e9
        return max(int(free // self.kv_bytes_per_token), 0)

    def max_concurrency(self, context: int) -> int:
        return self.kv_tokens // max(context, 1)

    def fits(self, concurrency: int, context: int) -> bool:
        return concurrency * context <= self.kv_tokens

    def to_json(self) -> dict:
        return {"memory_gb": self.memory_gb, "weights_gb": self.weights_gb,
                "kv_bytes_per_token": self.kv_bytes_per_token, "utilization": self.utilization,
                "kv_tokens": self.kv_tokens, "source": self.source}


def _from_names(meta: dict) -> tuple[float, float] | None:
    """(weights GB, KV bytes per token) of the meta's target and draft looked up by name, or None."""
    shapes = [MODELS.get(str(meta.get(key, "")).lower()) for key in ("target", "draft")]
    nbytes = DTYPE_BYTES.get(str(meta.get("dtype", "")))
    if None in shapes or nbytes is None:
        return None
    return (sum(s.params for s in shapes) * nbytes / 1e9, sum(s.kv_bytes_per_token(nbytes) for s in shapes))


def memory_budget(cost: CostTable, memory_gb: float = 0.0, utilization: float = 0.9) -> MemoryBudget | None:
    """The cost table's memory model, `memory_gb` overriding its device memory; None when unknown."""
    meta = cost.meta
    memory = memory_gb or float(meta.get("memory_gb") or 0.0)
    if "weights_gb" in meta and "kv_bytes_per_token" in meta:
        models, source = (float(meta["weights_gb"]), float(meta["kv_bytes_per_token"])), f"{meta.get('source')} meta"
    else:
        models, source = _from_names(meta), "model names in the cost table"
    if not memory or models is None:
        return None
    where = "--memory-gb" if memory_gb else f"{meta.get('device', '?')} ({meta.get('source', '?')})"
    return MemoryBudget(memory, models[0], models[1], utilization, f"memory: {where}; models: {source}")
