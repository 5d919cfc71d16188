"""Decode-path simulation of a routing decision over replayed generations, and its metrics.

Glossary:
  cycle        one target verification: a cache draft (cost verify(1 + len) + c_cache) or a K-token
               model draft (cost verify(1 + K) + K draft(1) [+ c_cache when the cache was consulted]);
               it emits accepted + 1 tokens (the bonus / corrected token). verify(T) = 1 + c_v T and
               draft(n) = c_d, or a measured table's curves (`HvdCost`, avkit/hvd/cost.py)
  route        per replay row (request, position t): use the cache draft?, and how many of its
               tokens to verify (<= its length)
  throughput   tokens / cost, in tokens per target forward; target-only decoding has 1.0
A router's decision at t depends only on features at t, so all of them are precomputed and the
path (t <- t + accepted + 1) advances all generations at once, one vectorized step per cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from avkit.hvd.cost import HvdCost


@dataclass(frozen=True)
class Route:
    use_cache: np.ndarray  # [R] bool, one per replay row
    verify_len: np.ndarray  # [R] int64, cache tokens verified (<= draft_len); ignored where not use_cache
    consults_cache: bool = True  # the hybrid pays the cache lookup on model cycles too


def full_route(table: pl.DataFrame, use_cache: np.ndarray, consults_cache: bool = True) -> Route:
    """Verify the whole cache draft where chosen; never choose an empty draft."""
    dl = table["draft_len"].to_numpy()
    return Route(np.asarray(use_cache, dtype=bool) & (dl > 0), dl.astype(np.int64), consults_cache)


def request_runs(table: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Rows (request_id, t) contiguous per request, as `replay` writes them -> (first row [G], rows [G]) of each."""
    rid = table["request_id"].to_numpy()
    starts = np.flatnonzero(np.r_[True, rid[1:] != rid[:-1]])  # [G]
    return starts, np.diff(np.r_[starts, len(rid)])


def simulate_paths(table: pl.DataFrame, route: Route, cost: HvdCost, k: int) -> pl.DataFrame:
    """Per request: tokens, cycles, cost, accepted draft tokens, cache cycles along the decode path.
    `table` holds rows (request_id, t) for t = 0..n-1 of every request, contiguous and t-sorted."""
    starts, lengths = request_runs(table)  # [G], [G]
    cache_acc = table["cache_acc"].to_numpy()
    model_acc = table["model_acc"].to_numpy()
    vlen = np.minimum(route.verify_len, table["draft_len"].to_numpy())
    g_n = len(starts)
    pos = np.zeros(g_n, dtype=np.int64)
    cycles, spent, accepted, cache_cycles = (np.zeros(g_n) for _ in range(4))
    model_cost = float(cost.verify(1 + k) + k * cost.draft(1))
    model_cost += cost.cache_cost if route.consults_cache else 0.0
    while True:
        g = np.flatnonzero(pos < lengths)
        if g.size == 0:
            break
        r = starts[g] + pos[g]  # replay row of each active generation
        uc = route.use_cache[r]
        a = np.where(uc, np.minimum(cache_acc[r], vlen[r]), model_acc[r])
        c = np.where(uc, cost.verify(1 + vlen[r]) + cost.cache_cost, model_cost)
        cycles[g] += 1
        spent[g] += c
        accepted[g] += a
        cache_cycles[g] += uc & (vlen[r] > 0)  # a cache row with no draft is a plain target step
        pos[g] += a + 1
    return pl.DataFrame({
        "request_id": table["request_id"].to_numpy()[starts], "dataset": table["dataset"].to_numpy()[starts], "tokens": lengths,
        "cycles": cycles, "cost": spent, "accepted": accepted, "cache_cycles": cache_cycles,
    })


def path_metrics(paths: pl.DataFrame, by: str | None = None) -> pl.DataFrame:
    """Cycles per 1000 tokens, mean accepted length per cycle, throughput, cache share (per `by` or overall)."""
    aggs = [
        (1000 * pl.col("cycles").sum() / pl.col("tokens").sum()).alias("cycles_per_1k"),
        (pl.col("accepted").sum() / pl.col("cycles").sum()).alias("mean_accepted"),
        (pl.col("tokens").sum() / pl.col("cost").sum()).alias("throughput"),
        (pl.col("cache_cycles").sum() / pl.col("cycles").sum()).alias("cache_share"),
        pl.col("tokens").sum().alias("tokens"),
    ]
    if by is None:
        return paths.select(aggs).with_columns(pl.lit("overall").alias("dataset"))
    return paths.group_by(by).agg(aggs).sort(by)


def throughput(table: pl.DataFrame, route: Route, cost: HvdCost, k: int) -> float:
    """Overall tokens per unit cost of one route (the objective tau is chosen for)."""
    p = simulate_paths(table, route, cost, k)
    return float(p["tokens"].sum() / p["cost"].sum())


def precision_recall(table: pl.DataFrame, use_cache: np.ndarray, high: int) -> tuple[float, float]:
    """High-payoff detection over rows with a cache draft: precision P(acc >= high | chosen) and
    recall P(chosen | acc >= high); nan when undefined."""
    has = table["draft_len"].to_numpy() > 0
    pos = (table["cache_acc"].to_numpy() >= high) & has
    chosen = np.asarray(use_cache, dtype=bool) & has
    tp = float((pos & chosen).sum())
    prec = tp / chosen.sum() if chosen.sum() else float("nan")
    rec = tp / pos.sum() if pos.sum() else float("nan")
    return prec, rec
