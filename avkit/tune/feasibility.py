"""Does a batch fit? KV cache for `concurrency` requests of `context` tokens next to both models' weights:
  fits(c) = c context kv_bytes_per_token <= utilization memory - weights(target + drafter)
kv_bytes_per_token: target's + drafter's 2 layers kv_heads head_dim bytes. The numbers come from the cost
table's meta (roofline, or `avkit profile`'s record), else its model names in the roofline's shapes;
`--memory-gb` overrides the memory. Activations and graphs are left to the utilization headroom.
"""

from __future__ import annotations

from avkit.config import TuneConfig
from avkit.errors import ConfigError
from avkit.scheduling.cost import CostTable
from avkit.scheduling.roofline import MODELS

DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0}


def memory_budget(cost: CostTable, memory_gb: float = 0.0, utilization: float = 0.9) -> dict | None:
    """The cost table's memory model, `memory_gb` overriding its device memory, as tune.json's `memory`:
    memory_gb, weights_gb, kv_bytes_per_token, utilization, kv_tokens (context tokens the KV pool holds, 0 when
    the weights alone do not fit), source; None when unknown."""
    meta = cost.meta
    memory = memory_gb or float(meta.get("memory_gb") or 0.0)
    if "weights_gb" in meta and "kv_bytes_per_token" in meta:
        weights, kv, source = float(meta["weights_gb"]), float(meta["kv_bytes_per_token"]), f"{meta.get('source')} meta"
    else:  # the meta's target and draft looked up by name in the roofline's shapes
        shapes = [MODELS.get(str(meta.get(key, "")).lower()) for key in ("target", "draft")]
        nbytes = DTYPE_BYTES.get(str(meta.get("dtype", "")))
        if None in shapes or nbytes is None:
            return None
        weights, kv = sum(s.params for s in shapes) * nbytes / 1e9, sum(s.kv_bytes_per_token(nbytes) for s in shapes)
        source = "model names in the cost table"
    if not memory:
        return None
    where = "--memory-gb" if memory_gb else f"{meta.get('device', '?')} ({meta.get('source', '?')})"
    return {"memory_gb": memory, "weights_gb": weights, "kv_bytes_per_token": kv, "utilization": utilization,
            "kv_tokens": max(int((utilization * memory - weights) * 1e9 // kv), 0),
            "source": f"memory: {where}; models: {source}"}


def feasible(config: TuneConfig, cost: CostTable, context: int) -> tuple[list[int], list[dict], dict | None]:
    """(the --concurrency that fit, [{concurrency, kv_tokens_needed, kv_tokens_available}] those that do not,
    the budget with context and max_concurrency; None: unknown, everything runs). None fits: one error line."""
    budget = memory_budget(cost, config.memory_gb, config.memory_utilization)
    conc = sorted(config.concurrency)
    if budget is None:
        return conc, [], None
    kv = budget["kv_tokens"]
    bad = [{"concurrency": c, "kv_tokens_needed": c * context, "kv_tokens_available": kv} for c in conc
           if c * context > kv]
    ok = [c for c in conc if c * context <= kv]
    if not ok:
        raise ConfigError(f"no --concurrency fits the KV cache: {conc[0]} x {context} tokens needs "
                          f"{conc[0] * context:,} KV tokens, {kv:,} fit next to {budget['weights_gb']:.1f} GB of "
                          f"weights in {budget['utilization']:.0%} of {budget['memory_gb']:g} GB")
    return ok, bad, {**budget, "context": context, "max_concurrency": kv // max(context, 1)}
