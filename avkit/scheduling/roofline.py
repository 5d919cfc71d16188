"""Roofline cost model: step costs of a named accelerator and model size, for what-if simulation.

A forward of a dense decoder (P parameters, L layers) is bounded by compute (2 P FLOPs per token, plus
attention over the context) and by memory (every weight read once); the target's KV reads scale with
requests, not tokens, so they go into `context_ms`:
  verify_ms(T)    = max(2 P T / F, P bytes / BW) + 4 L H d_head ctx T / F + launch
  context_ms(n)   = n ctx kv_bytes_per_token / BW
  draft_ms(n)     = the same forward for the draft model with n tokens, its own KV reads included
  kv_ms_per_token = kv_bytes_per_token / BW
F and BW are achievable (not datasheet) bf16 FLOP/s and bandwidth; compute/memory overlap and kernel
effects are ignored. scheduling/cost.py builds the table from these curves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from avkit.errors import ConfigError


@dataclass(frozen=True)
class Accelerator:
    name: str
    tflops: float  # achievable dense bf16 TFLOP/s (fp32 for CPU)
    tb_s: float  # achievable memory bandwidth, TB/s
    launch_ms: float  # fixed cost per forward (graph launch, sync)
    bytes_per_param: float = 2.0
    memory_gb: float = 0.0  # device memory, 1e9 bytes (0: unknown); `avkit tune` checks KV feasibility with it


# Achievable figures (about 80% of datasheet, H200 as measured in docs/budget.md).
ACCELERATORS = {
    "h200": Accelerator("H200", 790.0, 4.3, 0.05, memory_gb=141.0),
    "h100": Accelerator("H100", 700.0, 2.9, 0.05, memory_gb=80.0),
    "b200": Accelerator("B200", 1800.0, 6.4, 0.05, memory_gb=180.0),
    "mi300x": Accelerator("MI300X", 900.0, 4.2, 0.08, memory_gb=192.0),
    "a100": Accelerator("A100", 250.0, 1.6, 0.05, memory_gb=80.0),
    "cpu": Accelerator("CPU (2 cores, fp32)", 0.1, 0.012, 1.0, bytes_per_param=4.0),
}


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: float  # parameters
    layers: int
    heads: int
    kv_heads: int
    head_dim: int

    def kv_bytes_per_token(self, bytes_per_param: float) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * bytes_per_param  # K and V


_QWEN_15B = ModelShape("Qwen2.5-Coder-1.5B", 1.54e9, 28, 12, 2, 128)
_QWEN_05B = ModelShape("Qwen2.5-Coder-0.5B", 0.49e9, 24, 14, 2, 64)
MODELS = {
    "qwen2.5-coder-1.5b": _QWEN_15B, "1.5b": _QWEN_15B,
    "qwen2.5-coder-0.5b": _QWEN_05B, "0.5b": _QWEN_05B,
    "1b": ModelShape("Llama-3.2-1B", 1.24e9, 16, 32, 8, 64),
    "8b": ModelShape("Llama-3.1-8B", 8.03e9, 32, 32, 8, 128),
    "70b": ModelShape("Llama-3.1-70B", 70.6e9, 80, 64, 8, 128),
}
DEFAULT_DRAFT = {"1.5b": "0.5b", "qwen2.5-coder-1.5b": "0.5b", "8b": "0.5b", "70b": "1b",
                 "0.5b": "0.5b", "qwen2.5-coder-0.5b": "0.5b", "1b": "0.5b"}

_TOKEN_GRID = np.unique(np.r_[np.arange(1, 257), np.geomspace(256, 65536, 64).round()]).astype(int)
_REQUEST_GRID = np.unique(np.r_[np.arange(1, 65), np.geomspace(64, 8192, 48).round()]).astype(int)


def forward_ms(model: ModelShape, acc: Accelerator, tokens, requests, context: int) -> np.ndarray:
    """Roofline time of one forward: `tokens` query tokens from `requests` requests at `context`."""
    t = np.asarray(tokens, dtype=np.float64)
    flops = 2.0 * model.params * t
    attn_flops = 4.0 * model.layers * model.heads * model.head_dim * context * t  # QK^T and PV
    weight_bytes = model.params * acc.bytes_per_param
    kv_bytes = np.asarray(requests, dtype=np.float64) * context * model.kv_bytes_per_token(acc.bytes_per_param)
    f, bw = acc.tflops * 1e12, acc.tb_s * 1e12
    return 1e3 * (np.maximum(flops / f, weight_bytes / bw) + attn_flops / f + kv_bytes / bw) + acc.launch_ms


def _curves(accelerator: str, target: str, draft: str | None, context_len: int, drafter: str) -> dict:
    """The cost model's fields (scheduling/cost.py `CostTable`) for `target` (verify) and `draft`
    (drafting) on `accelerator`: plain tuples, the cost module builds the table."""
    acc = _lookup(ACCELERATORS, accelerator, "accelerator")
    tgt = _lookup(MODELS, target, "target model")
    drf = _lookup(MODELS, draft or DEFAULT_DRAFT.get(target.lower(), "0.5b"), "draft model")
    tokens, reqs = _TOKEN_GRID, _REQUEST_GRID
    verify = forward_ms(tgt, acc, tokens, 0, context_len)  # KV reads go to context_ms
    kv_bytes = tgt.kv_bytes_per_token(acc.bytes_per_param)
    context = 1e3 * reqs * context_len * kv_bytes / (acc.tb_s * 1e12)  # [Q] KV reads by requests
    draft_ms = forward_ms(drf, acc, reqs, reqs, context_len)
    meta = {"source": "roofline", "device": acc.name, "target": tgt.name, "draft": drf.name,
            "context_len": context_len, "tflops": acc.tflops, "tb_s": acc.tb_s, "memory_gb": acc.memory_gb,
            "weights_gb": (tgt.params + drf.params) * acc.bytes_per_param / 1e9,  # both models resident
            "kv_bytes_per_token": kv_bytes + drf.kv_bytes_per_token(acc.bytes_per_param)}  # target + drafter
    return {"verify_tokens": tuple(int(x) for x in tokens), "verify_ms": tuple(verify.tolist()),
            "draft_requests": tuple(int(x) for x in reqs), "draft_ms": tuple(draft_ms.tolist()),
            "context_ms": tuple(context.tolist()), "drafter": drafter, "meta": meta,
            "context_len": context_len, "kv_ms_per_token": 1e3 * kv_bytes / (acc.tb_s * 1e12)}


def roofline_curves(spec: str, default_context: str = "8192") -> dict:
    """`roofline:GPU:TARGET[:DRAFT][:context=N,drafter=parallel]` -> the cost model's fields (`_curves`)."""
    parts = spec.split(":")
    if len(parts) < 3 or parts[0] != "roofline":
        raise ConfigError(f"--cost {spec}: a roofline spec looks like roofline:GPU:MODEL[:DRAFT][:key=value,...]")
    opts = {}
    if "=" in parts[-1]:
        for kv in parts.pop().split(","):
            key, _, value = kv.partition("=")
            opts[key.strip()] = value.strip()
    unknown = set(opts) - {"context", "drafter"}
    if unknown:
        raise ConfigError(f"--cost {spec}: unknown option {min(unknown)} (context, drafter)")
    try:
        context = int(opts.get("context", default_context))
    except ValueError:
        raise ConfigError(f"--cost {spec}: context must be an integer, got {opts.get('context')}") from None
    draft = parts[3] if len(parts) > 3 else None
    try:
        return _curves(parts[1], parts[2], draft, context, opts.get("drafter", "autoregressive"))
    except ConfigError as e:  # an unknown accelerator or model: name the spec as typed
        raise ConfigError(f"--cost {spec}: {e}") from None


def _lookup(table: dict, name: str, what: str):
    if name.lower() not in table:
        raise ConfigError(f"unknown {what} {name}; choose from {', '.join(sorted(table))}")
    return table[name.lower()]
