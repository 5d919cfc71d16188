"""The schedule in each consumer's own terms, checked against that consumer's rules before it is printed.

vLLM 0.32, `speculative_config` (vllm/config/speculative.py, vllm/v1/spec_decode/dynamic/utils.py):
  num_speculative_tokens                 int > 0; every per-batch-size K is clamped to it
  num_speculative_tokens_per_batch_size  non-empty list of inclusive (batch_lo, batch_hi, K): lo, hi > 0,
                                         lo <= hi, K >= 0, sorted and non-overlapping, the first starting
                                         at 1; gaps and batch sizes past the last range take the K before
  enable_adaptive_verification           bool; Model Runner V2 on a GPU only (full CUDA graphs; vLLM-CPU
                                         refuses it)
  avkit also requires the ranges contiguous and every K <= num_speculative_tokens (nothing left to vLLM's
  carry-forward or clamp). A schedule that is 0 everywhere is `speculative_config: null` (speculation off).
TensorRT-LLM, `speculative_config` (llmapi DecodingBaseConfig):
  max_draft_len        int > 0
  draft_len_schedule   {batch_size: draft_len}: a key is the largest batch size of its range (batch sizes
                       from the previous key + 1 up to it use its value), 0 above the largest key; keys
                       >= 1, values >= 0 and <= max_draft_len, and the smallest key's value must equal
                       max_draft_len. A schedule whose K grows with batch size cannot be written: the
                       later K are clamped to the first one (the tuner reports what that costs).
"""

from __future__ import annotations

from avkit.errors import ConfigError


def _int(name: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ConfigError(f"{name} must be an integer >= {lo}, got {value!r}")
    return value


def check_vllm(spec: dict) -> dict:
    """Raise ConfigError naming the key and value unless `spec` (the speculative_config dict) passes."""
    n = _int("num_speculative_tokens", spec.get("num_speculative_tokens"), 1)
    sched = spec.get("num_speculative_tokens_per_batch_size")
    if not isinstance(sched, list) or not sched:
        raise ConfigError(f"num_speculative_tokens_per_batch_size must be a non-empty list, got {sched!r}")
    prev = 0
    for i, entry in enumerate(sched):
        where = f"num_speculative_tokens_per_batch_size[{i}]"
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise ConfigError(f"{where} must be (batch_lo, batch_hi, K), got {entry!r}")
        lo, hi = _int(f"{where} batch_lo", entry[0], 1), _int(f"{where} batch_hi", entry[1], 1)
        k = _int(f"{where} K", entry[2], 0)
        if lo > hi:
            raise ConfigError(f"{where}: batch_lo {lo} > batch_hi {hi}")
        if lo != prev + 1:
            raise ConfigError(f"{where}: starts at {lo}, expected {prev + 1} (ranges start at 1, contiguous, sorted)")
        if k > n:
            raise ConfigError(f"{where}: K {k} > num_speculative_tokens {n}")
        prev = hi
    if not isinstance(spec.get("enable_adaptive_verification", False), bool):
        raise ConfigError(f"enable_adaptive_verification must be a bool, got {spec['enable_adaptive_verification']!r}")
    return spec


def vllm_fragment(ranges: list[tuple[int, int, int]], adaptive: bool) -> dict:
    """{"speculative_config": {...}} for inclusive (lo, hi, K) ranges; null when K is 0 everywhere."""
    top = max(k for _, _, k in ranges)
    if top == 0:
        return {"speculative_config": None}
    spec = {"num_speculative_tokens": top,
            "num_speculative_tokens_per_batch_size": [[lo, hi, k] for lo, hi, k in ranges]}
    if adaptive:
        spec["enable_adaptive_verification"] = True
    return {"speculative_config": check_vllm(spec)}


def check_trtllm(spec: dict) -> dict:
    """Raise ConfigError naming the key and value unless `spec` passes TensorRT-LLM's rules (module note)."""
    top = _int("max_draft_len", spec.get("max_draft_len"), 1)
    sched = spec.get("draft_len_schedule")
    if not isinstance(sched, dict) or not sched:
        raise ConfigError(f"draft_len_schedule must be a non-empty mapping, got {sched!r}")
    keys = {}
    for key, value in sched.items():
        b = _int("draft_len_schedule key", int(key) if isinstance(key, str) and key.isdigit() else key, 1)
        keys[b] = _int(f"draft_len_schedule[{key}]", value, 0)
        if keys[b] > top:
            raise ConfigError(f"draft_len_schedule[{key}] = {value} > max_draft_len {top}")
    if keys[min(keys)] != top:
        raise ConfigError(f"draft_len_schedule[{min(keys)}] = {keys[min(keys)]} must equal max_draft_len {top} "
                          "(the smallest batch-size key)")
    return spec


def trtllm_schedule(ranges: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The ranges TensorRT-LLM can run: K clamped to the first range's, re-merged, trailing K = 0 dropped."""
    first = ranges[0][2]
    out: list[tuple[int, int, int]] = []
    for lo, hi, k in ranges:
        k = min(k, first)
        if out and out[-1][2] == k:
            out[-1] = (out[-1][0], hi, k)
        else:
            out.append((lo, hi, k))
    while out and out[-1][2] == 0:
        out.pop()
    return out


def trtllm_fragment(ranges: list[tuple[int, int, int]]) -> dict:
    """{"speculative_config": {"max_draft_len", "draft_len_schedule"}}; null when nothing drafts."""
    runnable = trtllm_schedule(ranges)
    if not runnable:
        return {"speculative_config": None}
    spec = {"max_draft_len": runnable[0][2], "draft_len_schedule": {str(hi): k for _, hi, k in runnable}}
    return {"speculative_config": check_trtllm(spec)}
