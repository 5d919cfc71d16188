"""The tune document compiled into each engine's own settings, checked against that engine's rules.

`engine_settings(doc, cost)` reads the schedule, the acceptance profile (avkit/tune/acceptance.py) and the
cost table of one `avkit tune` document and returns one payload per format (FORMATS; what each one is:
docs/vllm.md, "One acceptance profile, every engine's settings"), each EXACTLY what the engine takes (null:
speculation off everywhere). The rules each payload is checked against:

vLLM 0.32, `speculative_config` (vllm/config/speculative.py, vllm/v1/spec_decode/dynamic/utils.py):
  method, model                          `draft_model` + the draft's HF directory, or `suffix` (no model)
  draft_sample_method                    `greedy` (T = 0 profiles) or `probabilistic` (T > 0: the rate the
                                         profile measured is that of drafts sampled from q)
  num_speculative_tokens                 int > 0; every per-batch-size K is clamped to it
  num_speculative_tokens_per_batch_size  non-empty list of inclusive (batch_lo, batch_hi, K): lo, hi > 0,
                                         lo <= hi, K >= 0, sorted and non-overlapping, the first starting
                                         at 1; gaps and batch sizes past the last range take the K before
  enable_adaptive_verification           bool; Model Runner V2 on a GPU only (vLLM-CPU refuses it)
  rejection_sample_method "synthetic" +  synthetic_acceptance_rates: length num_speculative_tokens, each in
                                         [0, 1], non-increasing: position i's rate is P(the first i + 1
                                         drafts are all accepted), the profile's survival_i
  avkit also requires the ranges contiguous and every K <= num_speculative_tokens (nothing left to vLLM's
  carry-forward or clamp).
vLLM PR #48944 (read from its description, not from code): entries [bs_lo, bs_hi, ctx_lo, ctx_hi, K],
  inclusive; avkit writes, per context band, batch ranges from 1 as above, and context bands contiguous
  from 0, the last one carried past its end.
TensorRT-LLM, `speculative_config` (llmapi DecodingBaseConfig; TensorRT-LLM does not install here: these rules
and the gate's key names are as avkit's design notes describe them, not read in its code):
  max_draft_len        int > 0
  draft_len_schedule   {batch_size: draft_len}: a key is the largest batch size of its range (batch sizes
                       from the previous key + 1 up to it use its value), 0 above the largest key; keys
                       >= 1, values >= 0 and <= max_draft_len, and the smallest key's value must equal
                       max_draft_len. A schedule whose K grows with batch size cannot be written: the
                       later K are clamped to the first one (the tuner reports what that costs).
  acceptance_rate_window_size / acceptance_rate_threshold
                       speculation turns off for good once the rate over the window falls below the
                       threshold. avkit's threshold: the per-slot acceptance rate (accepted drafts / drafts)
                       at which max_draft_len drafts at one request break even with no speculation on the
                       cost table, per-slot acceptance i.i.d. (one request is where drafting pays most, so
                       below it drafting pays nowhere); window: enough request-steps that the 95% interval
                       of the profile's rate stays clear of the threshold (half the gap), at least 16.
SGLang 0.5.23 (read in its wheel: sglang/srt/speculative/adaptive_spec_params.py; the file and SGLang's routing:
  docs/vllm.md): avkit writes one entry per tuned range, keyed by its batch_lo, {"candidate_steps": [K]}.
  check_sglang applies `_load_adaptive_config`'s rules (integer-string batch-size keys, each entry's
  candidate_steps a non-empty list of ints >= 0) and the types of the keys `AdaptiveStepSlot` reads (SGLANG_KEYS,
  each optional at the top level, where it applies to every entry, or in an entry): candidate_steps, ema_alpha
  (default 0.2), update_interval (5), warmup_batches (10), down_hysteresis (-0.25), up_hysteresis (0.0),
  ceiling_coeff (0); any other key is refused (SGLang would ignore it silently).
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np

from avkit.config.simulate import TUNE_FORMATS
from avkit.errors import ConfigError
from avkit.tune.acceptance import Z95

FORMATS = TUNE_FORMATS[2:]  # the engines' payloads
UPSTREAM_CONTEXT_FORMAT = "vLLM PR #48944 (not in vLLM 0.32)"
VLLM_METHODS = {"model": "draft_model", "suffix": "suffix"}  # the trace's drafter -> vLLM's method


def _is_int(v, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int(name: str, value, lo: int) -> int:
    if not _is_int(value, lo):
        raise ConfigError(f"{name} must be an integer >= {lo}, got {value!r}")
    return value


def _check_batch_ranges(entries: list, n: int, where: str) -> None:
    """(batch_lo, batch_hi, K) triples: from 1, contiguous, sorted, K <= n."""
    prev = 0
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        lo, hi, k = (_int(f"{at} batch_lo", entry[0], 1), _int(f"{at} batch_hi", entry[1], 1),
                     _int(f"{at} K", entry[2], 0))
        if lo > hi:
            raise ConfigError(f"{at}: batch_lo {lo} > batch_hi {hi}")
        if lo != prev + 1:
            raise ConfigError(f"{at}: starts at {lo}, expected {prev + 1} (ranges start at 1, contiguous, sorted)")
        if k > n:
            raise ConfigError(f"{at}: K {k} > num_speculative_tokens {n}")
        prev = hi


def _check_schedule(spec: dict, ctx: bool) -> dict:
    """num_speculative_tokens and its non-empty per-batch-size list: (batch_lo, batch_hi, K) ranges, or with `ctx`
    (bs_lo, bs_hi, ctx_lo, ctx_hi, K) entries, each context band holding such ranges (module note)."""
    key, shape = "num_speculative_tokens_per_batch_size", ("(bs_lo, bs_hi, ctx_lo, ctx_hi, K)" if ctx else
                                                           "(batch_lo, batch_hi, K)")
    n = _int("num_speculative_tokens", spec.get("num_speculative_tokens"), 1)
    sched = spec.get(key)
    if not isinstance(sched, list) or not sched:
        raise ConfigError(f"{key} must be a non-empty list, got {sched!r}")
    bands: dict[tuple[int, int], list] = {}  # (ctx_lo, ctx_hi) -> its (batch_lo, batch_hi, K); one band without ctx
    for i, entry in enumerate(sched):
        if not isinstance(entry, list | tuple) or len(entry) != (5 if ctx else 3):
            raise ConfigError(f"{key}[{i}] must be {shape}, got {entry!r}")
        lo, hi = (_int(f"[{i}] ctx_lo", entry[2], 0), _int(f"[{i}] ctx_hi", entry[3], 0)) if ctx else (0, 0)
        if lo > hi:
            raise ConfigError(f"{key}[{i}]: ctx_lo {lo} > ctx_hi {hi}")
        bands.setdefault((lo, hi), []).append([entry[0], entry[1], entry[-1]])
    prev = -1
    for lo, hi in bands:  # in order of first appearance: sorted, contiguous from 0
        if lo != prev + 1:
            raise ConfigError(f"{key}: context band {lo}-{hi} starts at {lo}, expected {prev + 1} (bands start at 0, "
                              "contiguous, sorted)")
        _check_batch_ranges(bands[lo, hi], n, f"{key} (context {lo}-{hi})" if ctx else key)
        prev = hi
    return spec


def check_vllm(spec: dict) -> dict:
    """Raise ConfigError naming the key and value unless `spec` (the speculative_config dict) passes."""
    if not isinstance(spec.get("enable_adaptive_verification", False), bool):
        raise ConfigError(f"enable_adaptive_verification must be a bool, got {spec['enable_adaptive_verification']!r}")
    return _check_schedule(spec, ctx=False)


def check_vllm_context(spec: dict) -> dict:
    """The 5-item form's rules (module note): per context band, batch ranges as vLLM's 3-item ones."""
    return _check_schedule(spec, ctx=True)


def check_synthetic(spec: dict) -> dict:
    """vLLM's rules for synthetic_acceptance_rates (module note)."""
    n = _int("num_speculative_tokens", spec.get("num_speculative_tokens"), 1)
    rates = spec.get("synthetic_acceptance_rates")
    if spec.get("rejection_sample_method") != "synthetic":
        raise ConfigError(f"rejection_sample_method must be 'synthetic', got {spec.get('rejection_sample_method')!r}")
    if not isinstance(rates, list) or len(rates) != n:
        raise ConfigError(f"synthetic_acceptance_rates must be a list of {n}, got {rates!r}")
    if not all(isinstance(r, int | float) and 0.0 <= r <= 1.0 for r in rates):
        raise ConfigError(f"synthetic_acceptance_rates entries must be in [0, 1], got {rates!r}")
    if any(b > a for a, b in pairwise(rates)):
        raise ConfigError(f"synthetic_acceptance_rates must be non-increasing, got {rates!r}")
    return spec


TRTLLM_KEYS = ("max_draft_len", "draft_len_schedule", "acceptance_rate_window_size", "acceptance_rate_threshold")
# SGLang's per-slot keys (AdaptiveStepSlot.__init__): name -> (type check, what it must be)
SGLANG_KEYS = {
    "candidate_steps": (lambda v: isinstance(v, list) and bool(v) and all(_is_int(x, 0) for x in v),
                        "a non-empty list of integers >= 0"),
    "ema_alpha": (lambda v: _number(v) and 0.0 < v <= 1.0, "a number in (0, 1]"),
    "update_interval": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "warmup_batches": (lambda v: _is_int(v, 0), "an integer >= 0"),
    "down_hysteresis": (_number, "a number"),
    "up_hysteresis": (_number, "a number"),
    "ceiling_coeff": (lambda v: _number(v) and v >= 0, "a number >= 0"),
}


def check_trtllm(spec: dict) -> dict:
    """Raise ConfigError naming the key and value unless `spec` passes TensorRT-LLM's rules (module note)."""
    unknown = [key for key in spec if key not in TRTLLM_KEYS]
    if unknown:
        raise ConfigError(f"TensorRT-LLM speculative_config: unknown key {unknown[0]!r} (avkit writes "
                          f"{', '.join(TRTLLM_KEYS)})")
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
    if "acceptance_rate_window_size" in spec:
        _int("acceptance_rate_window_size", spec["acceptance_rate_window_size"], 1)
    rate = spec.get("acceptance_rate_threshold", 0.0)
    if not (_number(rate) and 0.0 <= rate <= 1.0):
        raise ConfigError(f"acceptance_rate_threshold must be a number in [0, 1], got {rate!r}")
    return spec


def check_sglang(config: dict) -> dict:
    """SGLang's rules for an adaptive config file (module note)."""
    entries = {k: v for k, v in config.items() if isinstance(k, str) and k.isdigit()}
    if not entries:
        raise ConfigError(f"the SGLang adaptive config needs at least one integer-string batch-size key, got "
                          f"{list(config)!r}")
    for key, entry in entries.items():
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not SGLANG_KEYS["candidate_steps"][0](steps):
            raise ConfigError(f"[{key}].candidate_steps must be a non-empty list of integers >= 0, got {steps!r}")
    top = {k: v for k, v in config.items() if k not in entries}
    for where, params in [("", top), *((f"[{k}].", e) for k, e in entries.items())]:
        for name, value in params.items():
            if name not in SGLANG_KEYS:
                raise ConfigError(f"{where}{name}: not a key SGLang's adaptive config reads ({', '.join(SGLANG_KEYS)})")
            ok, what = SGLANG_KEYS[name]
            if not ok(value):
                raise ConfigError(f"{where}{name} must be {what}, got {value!r}")
    return config


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


def break_even_rate(cost, k: int) -> float:
    """Per-slot acceptance a at which k drafts at one request emit as many tokens per ms as no speculation:
    sum_{i=0..k} a^i = step(1, k, k + 1) / step(1, 0, 1) (i.i.d. slots); -> the rate accepted / drafted."""
    ratio = float(cost.step_cost(1, k, k + 1) / cost.step_cost(1, 0, 1))
    a = np.linspace(0.0, 1.0, 100_001)  # [G]
    tokens = (a[:, None] ** np.arange(k + 1)).sum(axis=1)  # [G] expected tokens per step
    if tokens[-1] < ratio:
        return 1.0
    alpha = float(a[np.argmax(tokens >= ratio)])
    return (float((alpha ** np.arange(1, k + 1)).sum()) / k)


def _window(rate: float, threshold: float) -> int:
    """Request-steps whose 95% interval half-width at `rate` is half the gap to `threshold` (>= 16)."""
    gap = abs(rate - threshold) / 2
    if gap <= 0 or not math.isfinite(rate):
        return 16
    return max(16, math.ceil(Z95 ** 2 * rate * (1 - rate) / gap ** 2))


def _pooled(profile: dict) -> dict:
    return profile["groups"][-1]  # acceptance.py: the pooled group comes last


def _speculator(profile: dict, draft: str) -> dict:
    """method / model / draft_sample_method of the profiled pair (module note)."""
    pair = profile["pair"]
    method = VLLM_METHODS.get(pair["drafter"])
    if method is None:
        raise ConfigError(f"drafter {pair['drafter']!r}: vLLM has no method for it (traces of "
                          f"{', '.join(VLLM_METHODS)} drafters compile to vLLM)")
    if method != "draft_model":
        return {"method": method}
    temps = {g["temperature"] for g in profile["groups"]}
    sampled = pair.get("draft_sample_method") or ("probabilistic" if any(t for t in temps) else "greedy")
    return {"method": method, "model": draft or pair["draft"], "draft_sample_method": sampled}


def _context_entries(bands: list[tuple[int, int, list]]) -> list[list[int]]:
    return [[lo, hi, c_lo, c_hi, k] for c_lo, c_hi, rs in bands for lo, hi, k in rs]


def vllm_spec(ranges: list[tuple[int, int, int]], adaptive: bool, speculator: dict | None = None) -> dict | None:
    """The `--speculative-config` dict of inclusive (lo, hi, K) ranges after `speculator`'s keys (method,
    model, ...); None (speculation off) when K is 0 everywhere."""
    top = max(k for _, _, k in ranges)
    if top == 0:
        return None
    spec = {**(speculator or {}), "num_speculative_tokens": top,
            "num_speculative_tokens_per_batch_size": [list(r) for r in ranges]}
    return check_vllm(spec | ({"enable_adaptive_verification": True} if adaptive else {}))


def engine_settings(doc: dict, cost, *, adaptive_ok: bool, draft: str = "") -> dict:
    """Every format's payload (module note) from a tune document; keys are FORMATS with `_` for `-`."""
    ranges = [tuple(r) for r in doc["schedule"]["ranges"]]
    profile = doc["profile"]
    top = max(k for _, _, k in ranges)
    out: dict = dict.fromkeys(f.replace("-", "_") for f in FORMATS)
    runnable = trtllm_schedule(ranges)
    pooled = _pooled(profile)
    if runnable:
        k = runnable[0][2]
        threshold = break_even_rate(cost, k)
        rate = sum(p["survival"] for p in pooled["positions"][:k]) / k  # accepted / drafted, as break_even_rate
        out["trtllm"] = check_trtllm({"max_draft_len": k, "draft_len_schedule": {str(hi): k for _, hi, k in runnable},
                                      "acceptance_rate_window_size": _window(rate, threshold),
                                      "acceptance_rate_threshold": round(threshold, 4)})
    out["sglang"] = check_sglang({str(lo): {"candidate_steps": [k]} for lo, _, k in ranges})
    bands = doc["schedule"].get("context_ranges") or [[0, doc["context"]["tokens"], [list(r) for r in ranges]]]
    entries = _context_entries(bands)
    top_ctx = max(e[4] for e in entries)  # a band may draft where the base context does not
    if top_ctx == 0:
        return out
    spec = _speculator(profile, draft)
    out["vllm_context"] = check_vllm_context({**spec, "num_speculative_tokens": top_ctx,
                                              "num_speculative_tokens_per_batch_size": entries})
    if top == 0:
        return out
    base = {**spec, "num_speculative_tokens": top}
    out["vllm"] = vllm_spec(ranges, doc["schedule"]["adaptive"] and adaptive_ok, spec)
    rates = [round(p["survival"], 6) for p in pooled["positions"][:top]]
    out["vllm_synthetic"] = check_synthetic({**base, "rejection_sample_method": "synthetic",
                                             "synthetic_acceptance_rates": rates})
    return out

