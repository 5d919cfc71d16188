"""The HVD cost model from a measured step-cost table (`avkit profile`, docs/budget.md): what one
cycle costs on this device, in target forwards of one token, for the replay and the live joint plan.

    unit           verify_ms(1): one target forward over one token
    verify points  (T, verify_ms(T) / unit) at the table's token grid (a batch's bonus tokens + drafts)
    draft points   (n, (draft_ms(n) + draft_fixed_ms(n)) / unit): one draft-model step over n rows
    prefill points (L, prefill_ms(L) / unit): the draft model's prefill of L tokens (its catch-up before it
                   drafts a row it has not followed; `HvdCostConfig.catch_up`)
    c_v, c_d       summaries for the tables: least-squares slope of verify over 1..8 tokens, draft(1)
The table's context curve (KV reads by requests) is 0 in profiled tables and left out; a roofline
table with one is refused rather than mispriced.
"""

from __future__ import annotations

import numpy as np

from avkit.config import HvdCostConfig
from avkit.errors import ConfigError
from avkit.scheduling.cost import CostTable


def hvd_cost_from_table(table: CostTable, cache_cost: float = HvdCostConfig.cache_cost,
                        source: str = "") -> HvdCostConfig:
    if table.context_ms and any(table.context_ms):
        raise ConfigError(f"cost table {source or table.meta.get('path', '')}: a context_ms curve (roofline "
                          "tables) has no place in the HVD cost model; use a profiled table (`avkit profile`)")
    if table.drafter != "autoregressive":
        raise ConfigError(f"cost table {source}: drafter {table.drafter!r}; the HVD cost model prices an "
                          "autoregressive draft model (K passes)")
    unit = float(table.verify_cost(1))
    if unit <= 0:
        raise ConfigError(f"cost table {source}: verify_ms at 1 token is {unit}; it must be > 0")
    tokens = np.asarray(table.verify_tokens, dtype=np.float64)
    reqs = np.asarray(table.draft_requests, dtype=np.float64)
    verify = table.verify_cost(tokens) / unit  # [P]
    draft = (table.draft_pass_cost(reqs) + table.draft_fixed_cost(reqs)) / unit  # [Q]
    t = np.arange(1, 9, dtype=np.float64)
    c_v = float(np.polyfit(t, table.verify_cost(t) / unit, 1)[0])
    where = source or str(table.meta.get("path", ""))
    device = table.meta.get("device", "")
    return HvdCostConfig(verify_token_cost=max(c_v, 0.0), draft_step_cost=float(table.draft_pass_cost(1) / unit),
                         cache_cost=cache_cost, verify_points=tuple(zip(tokens.tolist(), verify.tolist())),
                         draft_points=tuple(zip(reqs.tolist(), draft.tolist())),
                         prefill_points=tuple(zip(map(float, table.prefill_tokens),
                                                  (np.asarray(table.prefill_ms, dtype=np.float64) / unit).tolist())),
                         source=f"{where} ({device})" if device else where)


def load_hvd_cost(path, cache_cost: float = HvdCostConfig.cache_cost) -> HvdCostConfig:
    """`avkit hvd --cost-table FILE`: a profiled cost table's JSON -> the HVD cost model."""
    return hvd_cost_from_table(CostTable.load(path), cache_cost, str(path))


__all__ = ["hvd_cost_from_table", "load_hvd_cost"]
