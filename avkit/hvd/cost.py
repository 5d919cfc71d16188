"""The HVD view of the step cost model (scheduling/cost.py): what one cycle costs, in target forwards of
one token, for the replay and the live joint plan. Every price is the cost model's, divided by its unit.

    unit           verify_ms(1): one target forward over one token
    verify(T)      verify_ms(T) / unit (a batch's bonus tokens + drafts)
    draft(n, k)    (k draft_ms(n) + draft_fixed_ms(n)) / unit: k draft tokens for each of n rows
    catch_up(lag)  catch_up_ms(lag) / unit: the draft model's prefill of what a row it has not followed
                   lacks (the cost model's catch-up rule)
    cache          lookup_ms / unit: a cache lookup and payoff prediction per request, where the cost model
                   learned it live (scheduling/learn.py); else `HvdCostConfig.cache_cost`
    c_v, c_d       summaries for the tables: least-squares slope of verify over 1..8 tokens, draft(1)
Linear (`HvdCostConfig`, the defaults): verify(T) = 1 + c_v T, draft(n, k) = k c_d, no catch-up price: a cost
model of exactly those lines. A measured table's context curve (KV reads by requests) is 0 in profiled
tables; a roofline table with one is refused rather than mispriced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from avkit.config import HvdCostConfig
from avkit.errors import ConfigError
from avkit.scheduling.cost import CostTable

LINEAR = "linear"


def linear_table(c_v: float, c_d: float) -> CostTable:
    """The cost model of HVD's linear defaults, in target forwards: verify 1 + c_v T, draft c_d, free catch-up."""
    return CostTable(verify_tokens=(0, 1), verify_ms=(1.0, 1.0 + c_v), draft_requests=(1, 2),
                     draft_ms=(c_d, c_d), prefill_tokens=(1, 2), prefill_ms=(0.0, 0.0), meta={"source": LINEAR})


@dataclass(frozen=True)
class HvdCost:
    """A cost model in target-forward units, plus the cache lookup's price (module note)."""

    table: CostTable = field(default_factory=lambda: linear_table(HvdCostConfig.verify_token_cost,
                                                                  HvdCostConfig.draft_step_cost))
    cache_cost: float = HvdCostConfig.cache_cost  # suffix lookup + payoff predictor
    verify_token_cost: float = HvdCostConfig.verify_token_cost  # c_v (summary)
    draft_step_cost: float = HvdCostConfig.draft_step_cost  # c_d (summary)
    source: str = ""  # where a measured table came from (path and device); "" = linear

    @classmethod
    def linear(cls, config: HvdCostConfig = HvdCostConfig()) -> HvdCost:
        return cls(linear_table(config.verify_token_cost, config.draft_step_cost), config.cache_cost,
                   config.verify_token_cost, config.draft_step_cost)

    def verify(self, tokens) -> np.ndarray:
        """Target forwards over `tokens` tokens (requests' bonus tokens + verified drafts), vectorized."""
        return self.table.verify_cost(tokens)

    def draft(self, requests, k=1) -> np.ndarray:
        """`k` draft tokens for each of `requests` rows: k passes and the drafting's fixed part once (the cost
        model's rule), vectorized; k = 1 is one draft-model step."""
        return self.table.draft_cost(requests, k)

    def catch_up(self, lag) -> np.ndarray:
        """What drafting a row whose draft model lacks `lag` tokens costs first (the cost model's rule)."""
        return self.table.catch_up_cost(lag)

    def to_json(self) -> dict:
        return {"table": self.table.to_json(), "cache_cost": self.cache_cost,
                "verify_token_cost": self.verify_token_cost, "draft_step_cost": self.draft_step_cost,
                "source": self.source}

    @classmethod
    def from_json(cls, d: dict) -> HvdCost:
        """Back from `to_json`; older payoff files stored the scalars and (x, cost) point lists instead (`points`)."""
        d = dict(d or {})
        if "table" in d:
            return cls(CostTable.from_json(d.pop("table")), **d)
        base = HvdCostConfig(**{k: d[k] for k in ("verify_token_cost", "draft_step_cost", "cache_cost") if k in d})
        if not any(d.get(n) for n in ("verify_points", "draft_points", "prefill_points")):
            return cls.linear(base)
        lines, curves = linear_table(base.verify_token_cost, base.draft_step_cost), {}
        for name, grid, ms in (("verify_points", "verify_tokens", "verify_ms"),
                               ("draft_points", "draft_requests", "draft_ms"),
                               ("prefill_points", "prefill_tokens", "prefill_ms")):
            # a curve absent from the points keeps the linear model's (prefill: free)
            xs, ys = zip(*d[name]) if d.get(name) else (getattr(lines, grid), getattr(lines, ms))
            curves[grid], curves[ms] = tuple(int(x) for x in xs), tuple(float(y) for y in ys)
        return cls(CostTable(**curves), base.cache_cost, base.verify_token_cost, base.draft_step_cost,
                   d.get("source", ""))

    @classmethod
    def points(cls, **kw) -> HvdCost:
        """From (x, cost) lists: verify_points (T, forward), draft_points (n, step), prefill_points (L, prefill;
        none: free catch-ups) and the scalars of `HvdCostConfig`; no points: the linear model."""
        return cls.from_json(kw)


def hvd_cost_from_table(table: CostTable, cache_cost: float = HvdCostConfig.cache_cost,
                        source: str = "") -> HvdCost:
    if table.context_ms and any(table.context_ms):
        raise ConfigError(f"cost table {source or table.meta.get('path', '')}: a context_ms curve (roofline "
                          "tables) has no place in the HVD cost model; use a profiled table (`avkit profile`)")
    if table.drafter != "autoregressive":
        raise ConfigError(f"cost table {source}: drafter {table.drafter!r}; the HVD cost model prices an "
                          "autoregressive draft model (K passes)")
    unit = float(table.verify_cost(1))
    if unit <= 0:
        raise ConfigError(f"cost table {source}: verify_ms at 1 token is {unit}; it must be > 0")
    units = table.in_units(unit)
    t = np.arange(1, 9, dtype=np.float64)
    c_v = float(np.polyfit(t, units.verify_cost(t), 1)[0])
    where, device = source or str(table.meta.get("path", "")), table.meta.get("device", "")
    cache_cost = units.lookup_ms if table.lookup_ms > 0 else cache_cost  # learned live: the table's own price
    return HvdCost(units, cache_cost, max(c_v, 0.0), float(units.draft_pass_cost(1)),
                   f"{where} ({device})" if device else where)


def load_hvd_cost(path, cache_cost: float = HvdCostConfig.cache_cost) -> HvdCost:
    """`avkit hvd --cost-table FILE`: a cost file -> the HVD cost model."""
    return hvd_cost_from_table(CostTable.load(path), cache_cost, str(path))


__all__ = ["HvdCost", "hvd_cost_from_table", "linear_table", "load_hvd_cost"]
