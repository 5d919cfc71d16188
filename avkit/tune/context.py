"""Context-aware tuning: K per (batch-size range, context-length range), since a step's KV reads grow with context.

`--context-bands 2047,8191,32767` splits context lengths into inclusive bands [0, 2047], [2048, 8191],
[8192, 32767] (the last one carried past its end, as vLLM carries the last batch range). Each band is tuned as a
whole `avkit tune` run whose cost model is evaluated at the band's middle context (`lo + (hi - lo) // 2`, which
is also that run's KV-feasibility context), so the recommended ranges of every band come from the same rules
(schedule.py) on the same traces; only the step cost changes. What a band adds to the document:
  schedule.context_ranges   [[ctx_lo, ctx_hi, [[bs_lo, bs_hi, K], ...]], ...]: what formats.py writes as vLLM
                            PR #48944's 5-item entries (`--format vllm-context`)
  schedule.context_changes  [{concurrency, k_by_band}] where the recommended K differs between bands
The cost model must take a context: a roofline spec (`roofline:GPU:TARGET[:DRAFT][:context=N]`, the band's
context replaces N). A profiled table was measured at one context and is refused with one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from avkit.config import TuneConfig
from avkit.errors import ConfigError


def band_bounds(upper: tuple[int, ...]) -> list[tuple[int, int]]:
    """Inclusive (lo, hi) bands from ascending upper bounds, the first starting at 0.

    >>> band_bounds((2047, 8191))
    [(0, 2047), (2048, 8191)]
    """
    if list(upper) != sorted(set(upper)) or upper[0] < 1:
        raise ConfigError(f"--context-bands must be ascending distinct integers >= 1, got {','.join(map(str, upper))}")
    return list(zip([0, *(u + 1 for u in upper[:-1])], upper))


def at_context(spec: str, context: int) -> str:
    """The cost spec evaluated at `context` tokens (a roofline spec; a profiled table is refused)."""
    if not spec.startswith("roofline:"):
        raise ConfigError(f"--context-bands needs a cost model that takes the context (a roofline spec); {spec!r} "
                          "was measured at one context")
    parts = spec.split(":")
    opts = [o for o in (parts[-1].split(",") if "=" in parts[-1] else []) if not o.startswith("context=")]
    head = parts[:-1] if "=" in parts[-1] else parts
    return ":".join([*head, ",".join([*opts, f"context={context}"])])


def context_schedule(paths: list[str], config: TuneConfig, run: Callable[..., dict]) -> dict:
    """Tune every band (module docstring) -> {"context_ranges", "context_changes", "bands"}."""
    bands, per_band = band_bounds(config.context_bands), []
    for lo, hi in bands:
        mid = lo + (hi - lo) // 2
        doc = run(paths, replace(config, cost=at_context(config.cost, mid), context=mid, context_bands=(),
                                 bootstrap=min(config.bootstrap, 50)))
        per_band.append({"ctx_lo": lo, "ctx_hi": hi, "context": mid, "ranges": doc["schedule"]["ranges"],
                         "k": {r["concurrency"]: r["k"] for r in doc["schedule"]["per_concurrency"]}})
    concurrencies = sorted({c for b in per_band for c in b["k"]})
    changes = [{"concurrency": c, "k_by_band": [b["k"].get(c) for b in per_band]} for c in concurrencies
               if len({b["k"].get(c) for b in per_band}) > 1]
    return {"context_ranges": [[b["ctx_lo"], b["ctx_hi"], b["ranges"]] for b in per_band],
            "context_changes": changes, "bands": per_band}


__all__ = ["at_context", "band_bounds", "context_schedule"]
