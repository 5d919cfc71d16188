"""HVD's cost model: a `CostTable` in target forwards of one token (a measured table: `in_forwards`);
its `lookup_ms` is the cache lookup + payoff prediction per request that consulted the cache. `linear_table` is
`HvdCostConfig`'s lines: verify(T) = 1 + c_v T, draft(n, k) = k c_d, free catch-up.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from avkit.config import HvdCostConfig
from avkit.errors import ConfigError
from avkit.scheduling.cost import CURVES, CostTable

LINEAR = "linear"


def linear_table(config: HvdCostConfig = HvdCostConfig()) -> CostTable:
    """The cost model of HVD's linear defaults, in target forwards."""
    c_v, c_d = config.verify_token_cost, config.draft_step_cost
    return CostTable(verify_tokens=(0, 1), verify_ms=(1.0, 1.0 + c_v), draft_requests=(1, 2), draft_ms=(c_d, c_d),
                     prefill_tokens=(1, 2), prefill_ms=(0.0, 0.0), lookup_ms=config.cache_cost,
                     meta={"source": LINEAR})


def in_forwards(table: CostTable, cache_cost: float = HvdCostConfig.cache_cost) -> CostTable:
    """HVD's unit view: every price divided by verify_ms(1), one target forward over one token; the lookup price
    the table's where it learned one live, else `cache_cost` (in forwards). HVD prices an autoregressive draft
    model's K passes on a profiled table: a context curve (roofline) or a parallel drafter is refused."""
    path, device = str(table.meta.get("path", "")), table.meta.get("device", "")
    if any(table.context_ms):
        raise ConfigError(f"cost table {path}: a context_ms curve (roofline tables) has no place in the HVD cost "
                          "model; use a profiled table (`avkit profile`)")
    if table.drafter != "autoregressive":
        raise ConfigError(f"cost table {path}: drafter {table.drafter!r}; the HVD cost model prices an "
                          "autoregressive draft model (K passes)")
    unit = float(table.verify_cost(1))
    if unit <= 0:
        raise ConfigError(f"cost table {path}: verify_ms at 1 token is {unit}; it must be > 0")
    return replace(table, **{name: tuple((np.asarray(getattr(table, name), dtype=np.float64) / unit).tolist())
                             for name in CURVES}, kv_ms_per_token=table.kv_ms_per_token / unit,
                   lookup_ms=table.lookup_ms / unit if table.lookup_ms > 0 else cache_cost,
                   meta={**table.meta, "unit_ms": unit, "where": f"{path} ({device})" if device else path})


def summary(cost: CostTable) -> dict:
    """The payoff file's and hvd_metrics.json's "cost" (read back by `cost_from_json`)."""
    t = np.arange(1, 9, dtype=np.float64)
    c_v = round(float(np.polyfit(t, cost.verify_cost(t), 1)[0]), 9)
    return {"table": cost.to_json(), "cache_cost": cost.lookup_ms, "verify_token_cost": max(c_v, 0.0),
            "draft_step_cost": float(cost.draft_pass_cost(1)), "source": cost.meta.get("where", "")}


def cost_from_json(d: dict | None) -> CostTable:
    """The unit table back from `summary`. Older payoff files: a table whose c_cache was charged once per step
    (read as the per-request lookup price), or the scalars of `HvdCostConfig` and (x, cost) point lists:
    verify_points (T, forward), draft_points (n, step), prefill_points (L, prefill; none: free catch-ups);
    no points: the linear model."""
    d = dict(d or {})
    base = HvdCostConfig(**{k: d[k] for k in ("verify_token_cost", "draft_step_cost", "cache_cost") if k in d})
    where = {"where": d["source"]} if d.get("source") else {}
    if "table" in d:
        table = CostTable.from_json(d["table"])
        return replace(table, lookup_ms=base.cache_cost, meta={**table.meta, **where})
    if not any(d.get(n) for n in ("verify_points", "draft_points", "prefill_points")):
        return linear_table(base)
    lines, curves = linear_table(base), {}
    for name, grid, ms in (("verify_points", "verify_tokens", "verify_ms"),
                           ("draft_points", "draft_requests", "draft_ms"),
                           ("prefill_points", "prefill_tokens", "prefill_ms")):
        # a curve absent from the points keeps the linear model's (prefill: free)
        xs, ys = zip(*d[name]) if d.get(name) else (getattr(lines, grid), getattr(lines, ms))
        curves[grid], curves[ms] = tuple(int(x) for x in xs), tuple(float(y) for y in ys)
    return CostTable(**curves, lookup_ms=base.cache_cost, meta=where)
