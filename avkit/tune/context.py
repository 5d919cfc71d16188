"""Context-aware tuning (`--context-bands`): K per (batch-size range, context band), since a step's KV reads
grow with context.

`--context-bands 2047,8191,32767` makes inclusive bands [0, 2047], [2048, 8191], [8192, 32767] (the last
carried past its end). Each band is a whole `avkit tune` run on the same traces with the cost model at the
band's middle context (also its KV-feasibility context): a roofline spec with `context=` replaced, or a table
with kv_ms_per_token > 0 `moved` there (refused below its context_len, or with kv_ms_per_token 0). Adds
schedule.context_ranges ([[ctx_lo, ctx_hi, ranges]]: vLLM PR #48944's 5-item entries, `--format
vllm-context`), schedule.context_changes ([{concurrency, k_by_band}] where K differs) and schedule.bands.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from avkit.config import TuneConfig
from avkit.errors import ConfigError
from avkit.scheduling.cost import CostTable, resolve_cost


def band_bounds(upper: tuple[int, ...]) -> list[tuple[int, int]]:
    """Inclusive (lo, hi) bands from ascending upper bounds, the first starting at 0.

    >>> band_bounds((2047, 8191))
    [(0, 2047), (2048, 8191)]
    """
    if list(upper) != sorted(set(upper)) or upper[0] < 1:
        raise ConfigError(f"--context-bands must be ascending distinct integers >= 1, got {','.join(map(str, upper))}")
    return list(zip([0, *(u + 1 for u in upper[:-1])], upper))


def moved(table: CostTable, context: int) -> CostTable:
    """The table priced at `context` cached tokens per request: its context curve raised by kv_ms_per_token per
    token beyond context_len (n per request), i.e. step_cost with n x context cached tokens where the curves hold
    n x context_len (for a profiled table's other layouts they differ by its `held_context`)."""
    n = np.asarray(table.draft_requests, dtype=np.float64)  # [Q]
    ms = table.curve("context_ms")[1] + table.kv_ms_per_token * n * (context - table.context_len)  # [Q]
    return replace(table, context_ms=tuple(ms.tolist()), context_len=context,
                   meta={**table.meta, "context_len": context, "moved_from_context": table.context_len})


def at_context(spec: str, context: int, workdir: Path | None = None) -> str:
    """The cost spec evaluated at `context` tokens (module docstring): a roofline spec with that context, or the
    moved table written as JSON into `workdir` (its path)."""
    if not spec.startswith("roofline:"):
        table = resolve_cost(spec)
        name = spec or "the default cost table"
        if not table.kv_ms_per_token:
            raise ConfigError(f"--context-bands needs a cost model that takes the context: {name} was measured at "
                              "one context (kv_ms_per_token 0); use a table with kv_ms_per_token or a roofline spec")
        if context < table.context_len:
            raise ConfigError(f"--context-bands: a band's middle context {context} is below the {table.context_len} "
                              f"tokens {name} was measured at; start the bands there or profile at a shorter context")
        if workdir is None:
            raise ConfigError("at_context: a cost table needs a folder for the moved table")
        return str(moved(table, context).save(Path(workdir) / f"cost_at_{context}.json"))
    parts = spec.split(":")
    opts = [o for o in (parts[-1].split(",") if "=" in parts[-1] else []) if not o.startswith("context=")]
    head = parts[:-1] if "=" in parts[-1] else parts
    return ":".join([*head, ",".join([*opts, f"context={context}"])])


def context_schedule(paths: list[str], config: TuneConfig, run: Callable[..., dict]) -> dict:
    """Tune every band (module docstring) -> {"context_ranges", "context_changes", "bands"}."""
    bands, per_band = band_bounds(config.context_bands), []
    with tempfile.TemporaryDirectory(prefix="avkit-tune-context-") as workdir:
        for lo, hi in bands:
            mid = lo + (hi - lo) // 2
            doc = run(paths, replace(config, cost=at_context(config.cost, mid, Path(workdir)), context=mid,
                                     context_bands=(), bootstrap=min(config.bootstrap, 50)))
            per_band.append({"ctx_lo": lo, "ctx_hi": hi, "context": mid, "ranges": doc["schedule"]["ranges"],
                             "k": {r["concurrency"]: r["k"] for r in doc["schedule"]["per_concurrency"]}})
    concurrencies = sorted({c for b in per_band for c in b["k"]})
    changes = [{"concurrency": c, "k_by_band": [b["k"].get(c) for b in per_band]} for c in concurrencies
               if len({b["k"].get(c) for b in per_band}) > 1]
    return {"context_ranges": [[b["ctx_lo"], b["ctx_hi"], b["ranges"]] for b in per_band],
            "context_changes": changes, "bands": per_band}
