"""Decode-path simulation of a routing decision over replayed generations, and its metrics (`evaluate`).

Glossary:
  cycle        one target verification: a cache draft (cost verify(1 + len) + c_cache) or a K-token
               model draft (cost verify(1 + K) + draft(1, K) [+ c_cache when the cache was consulted]);
               it emits accepted + 1 tokens (the bonus / corrected token). Priced by `CostTable.step_cost`
               in target forwards (avkit/hvd/cost.py): the linear model or a measured table's curves
  route        per replay row (request, position t): use the cache draft?, and how many of its
               tokens to verify (<= its length)
  throughput   tokens / cost, in tokens per target forward; target-only decoding has 1.0
  step         n requests decoding in lockstep, m of them drafted by the model, L of them consulting the
               cache, pay draft(m, K) [m > 0] + L c_cache + verify(n + verified drafts)
               (`CostTable.step_cost`); one request alone is a cycle
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from avkit.hvd import METRICS, SPEEDUPS
from avkit.hvd.cost import summary
from avkit.scheduling.cost import CostTable


@dataclass(frozen=True)
class Route:
    use_cache: np.ndarray  # [R] bool, one per replay row
    verify_len: np.ndarray  # [R] int64, cache tokens verified (<= draft_len); ignored where not use_cache
    consults_cache: bool = True  # the hybrid pays the cache lookup on model cycles too


def full_route(table: pl.DataFrame, use_cache: np.ndarray, consults_cache: bool = True) -> Route:
    """Verify the whole cache draft where chosen; never choose an empty draft (`table`: rows, or columns)."""
    dl = np.asarray(table["draft_len"])
    return Route(np.asarray(use_cache, dtype=bool) & (dl > 0), dl.astype(np.int64), consults_cache)


def request_runs(table: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Rows (request_id, t) contiguous per request, as `replay` writes them -> (first row [G], rows [G]) of each."""
    rid = table["request_id"].to_numpy()
    starts = np.flatnonzero(np.r_[True, rid[1:] != rid[:-1]])  # [G]
    return starts, np.diff(np.r_[starts, len(rid)])


@dataclass(frozen=True)
class Cycles:
    """Every cycle of every request's decode path, in step order (a request's cycles in their order)."""

    request: np.ndarray  # [C] request index g (0..G-1, `request_runs` order)
    step: np.ndarray  # [C] the lockstep step it ran in
    use_cache: np.ndarray  # [C] bool, the cache drafted
    verify: np.ndarray  # [C] draft tokens verified (cache: <= its draft; model: K, or the planned prefix)
    accepted: np.ndarray  # [C] accepted draft tokens (<= verify)
    catch_up: float = 0.0  # target forwards of the draft model's catch-ups (`decode`'s `catch_up`)


def decode(table: pl.DataFrame, concurrency: int, decide, catch_up: CostTable | None = None) -> Cycles:
    """Requests decode `concurrency` at a time in lockstep, in table order (a waiting request takes a finished
    one's slot the next step); `table` holds rows (request_id, t), t = 0..n-1, contiguous and t-sorted. Each
    step `decide(r [n] replay rows, lag [n] | None)` -> (use_cache [n] bool, verify [n]); a row accepts
    min(its draft's oracle accepted length, verify) and moves t <- t + accepted + 1. `catch_up`: the draft
    model holds a request only from its first model draft on (the prompt: `log_prompt_len`) and keeps the
    accepted drafts; `lag` is what it lacks, priced by this table's `catch_up_cost` where it drafts."""
    starts, lengths = request_runs(table)  # [G], [G]
    cache_acc, model_acc = table["cache_acc"].to_numpy(), table["model_acc"].to_numpy()
    queue, live, pos = list(range(len(starts)))[::-1], [], np.zeros(len(starts), dtype=np.int64)
    follows = catch_up is not None and "log_prompt_len" in table.columns
    prompt = (np.rint(np.expm1(table["log_prompt_len"].to_numpy()[starts])).astype(np.int64)
              if follows else np.zeros(len(starts), dtype=np.int64))  # [G]
    have = prompt * 0  # [G] tokens the draft model holds
    rounds, catch = [], 0.0
    while queue or live:
        live = [g for g in live if pos[g] < lengths[g]]
        while queue and len(live) < concurrency:
            live.append(queue.pop())
        if not live:
            break
        g = np.array(live)
        r = starts[g] + pos[g]  # [n] replay rows
        lag = prompt[g] + pos[g] - have[g] if follows else None  # [n]
        uc, verify = decide(r, lag)
        acc = np.minimum(np.where(uc, cache_acc[r], model_acc[r]), verify)
        if follows:  # the rows the model drafts for catch up first
            drafts = ~uc & (verify > 0)  # [n]
            catch += float(catch_up.catch_up_cost(lag[drafts]).sum())
            have[g] = np.where(drafts, prompt[g] + pos[g] + np.minimum(verify - 1, acc), have[g])
        rounds.append((g, np.full(len(g), len(rounds)), uc, verify, acc))
        pos[g] += acc + 1
    g, s, uc, v, a = (np.concatenate(x) for x in zip(*rounds)) if rounds else (np.zeros(0, np.int64),) * 5
    return Cycles(g, s, uc.astype(bool), v, a, catch)


def route_decide(table: pl.DataFrame, route: Route, k: int):
    """`decode`'s decision of a fixed route: the cache draft (its verified prefix) or K model drafts."""
    vlen = np.minimum(route.verify_len, table["draft_len"].to_numpy())
    return lambda r, lag: (route.use_cache[r], np.where(route.use_cache[r], vlen[r], k))


def step_price(cost: CostTable, k: int, rows, cache, verified, lookup: bool) -> np.ndarray:
    """Target forwards of steps (glossary) of `rows` requests, `cache` of them drafted by the cache and the rest
    by the draft model (K tokens each, paid once when any row needs it), `verified` draft tokens in all; every row
    looks the cache up when `lookup`, else the cache rows only. Arrays broadcast ([S] steps or options)."""
    model = rows - cache
    return cost.step_cost(rows, k * (model > 0), rows + verified, draft_rows=model, lookups=rows if lookup else cache)


def simulate_paths(table: pl.DataFrame, route: Route, cost: CostTable, k: int) -> pl.DataFrame:
    """Per request, one at a time (each cycle a step of its own): tokens, cycles, cost, accepted draft tokens,
    cache cycles along the decode path."""
    starts, lengths = request_runs(table)  # [G], [G]
    c = decode(table, len(starts), route_decide(table, route, k))  # all at once: each cycle its own step
    spent = step_price(cost, k, 1, c.use_cache.astype(np.int64), c.verify, route.consults_cache)  # [C]
    by = lambda w: np.bincount(c.request, weights=w, minlength=len(starts))
    return pl.DataFrame({
        "request_id": table["request_id"].to_numpy()[starts], "dataset": table["dataset"].to_numpy()[starts],
        "tokens": lengths, "cycles": by(None), "cost": by(spent), "accepted": by(c.accepted),
        "cache_cycles": by(c.use_cache & (c.verify > 0)),  # a cache row with no draft is a plain target step
    })


def path_metrics(paths: pl.DataFrame, by: str | None = None) -> pl.DataFrame:
    """Cycles per 1000 tokens, mean accepted length per cycle, throughput, cache share, and precision
    P(acc >= high | chosen) / recall P(chosen | acc >= high) over positions with a cache draft (nan when
    undefined), per `by` or overall."""
    aggs = [
        (1000 * pl.col("cycles").sum() / pl.col("tokens").sum()).alias("cycles_per_1k"),
        (pl.col("accepted").sum() / pl.col("cycles").sum()).alias("mean_accepted"),
        (pl.col("tokens").sum() / pl.col("cost").sum()).alias("throughput"),
        (pl.col("cache_cycles").sum() / pl.col("cycles").sum()).alias("cache_share"),
        pl.col("tokens").sum().alias("tokens"),
        (pl.col("hits").sum() / pl.col("chosen").sum()).alias("precision"),
        (pl.col("hits").sum() / pl.col("high").sum()).alias("recall"),
    ]
    if by is None:
        return paths.select(aggs).with_columns(pl.lit("overall").alias("dataset"))
    return paths.group_by(by).agg(aggs).sort(by)


def throughput(table: pl.DataFrame, route: Route, cost: CostTable, k: int) -> float:
    """Overall tokens per unit cost of one route (the objective tau is chosen for)."""
    p = simulate_paths(table, route, cost, k)
    return float(p["tokens"].sum() / p["cost"].sum())


def evaluate(table: pl.DataFrame, routes: dict[str, Route], cost: CostTable, k: int,
             high: int = 6, predictions: dict[str, np.ndarray] | None = None) -> pl.DataFrame:
    """Metrics of every route per dataset and overall, with speedups over `model` and `cache` routes
    (which must be among `routes`) and over target-only decoding (throughput 1). Columns c_draft,
    c_verify, c_cache state the cost model (avkit/hvd/cost.py, in target forwards) the speedups assume.
    Precision / recall of high-payoff drafts compare `predictions[name] >= high` (the predicted
    payoff, as the paper does) with the oracle `cache_acc >= high`; routers without a prediction
    are scored on their decision (cache chosen)."""
    starts, lengths = request_runs(table)  # [G], [G]
    per_request = lambda w: np.bincount(np.repeat(np.arange(len(starts)), lengths), weights=w,
                                        minlength=len(starts))  # [rows] -> [G]
    has = table["draft_len"].to_numpy() > 0  # [rows] positions with a cache draft
    high_rows = (table["cache_acc"].to_numpy() >= high) & has  # [rows]
    rows = []
    for name, route in routes.items():
        flag = predictions[name] >= high if predictions and name in predictions else route.use_cache
        chosen = np.asarray(flag, dtype=bool) & has  # [rows]
        paths = simulate_paths(table, route, cost, k).with_columns(
            hits=per_request(high_rows & chosen), chosen=per_request(chosen), high=per_request(high_rows))
        per = pl.concat([path_metrics(paths, "dataset"), path_metrics(paths)], how="diagonal")
        rows.append(per.with_columns(router=pl.lit(name)))
    res = pl.concat(rows, how="diagonal")
    base = res.select("dataset", "router", "throughput")
    for ref in ("model", "suffix"):
        tp = base.filter(pl.col("router") == ref).select("dataset", pl.col("throughput").alias(f"tp_{ref}"))
        res = res.join(tp, on="dataset", how="left").with_columns(
            (pl.col("throughput") / pl.col(f"tp_{ref}")).alias(f"speedup_vs_{ref}")).drop(f"tp_{ref}")
    # the cost model beside every row: a reader of the table alone knows what the speedups assume
    c = summary(cost)
    return res.with_columns(speedup_vs_target=pl.col("throughput"), c_draft=pl.lit(c["draft_step_cost"]),
                            c_verify=pl.lit(c["verify_token_cost"]), c_cache=pl.lit(c["cache_cost"])).select(
        "router", "dataset", "tokens", *METRICS, "throughput", *SPEEDUPS, "c_draft", "c_verify", "c_cache")
