"""Trace replay for Hybrid Verified Decoding (docs/hvd.md; HVD paper, seed 003 in docs/seeds.md).

For every position t of every recorded greedy generation the replay rebuilds the suffix cache as
it stood (prompt + output[:t] in the request's local tree, earlier responses in the global tree),
drafts from it, and compares the draft with the target's actual continuation output[t:]:
  cache_acc[t]  oracle accepted length = common prefix of the cache draft and output[t:]
  model_acc[t]  the model drafter's accepted length at t (`avkit.hvd.model_accept`)
Rows: one per (request, t) with the features of `avkit.hvd.features`. Routers turn rows into a
`Route`; `evaluate` walks the decode path of each route and reports, per dataset and overall,
cycles per 1000 tokens, mean accepted length, throughput and speedups, and precision / recall of
high-payoff (accepted >= 6) cache drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from avkit.config import HvdReplayConfig, SuffixCacheConfig
from avkit.errors import TraceError
from avkit.hvd.cost import HvdCost
from avkit.hvd.features import history_features, structure_features
from avkit.hvd.model_accept import accept_lengths, matches_from_trace
from avkit.hvd.path import Route, path_metrics, precision_recall, simulate_paths
from avkit.hvd.substrings import SubstringIndex
from avkit.hvd.suffix_cache import CacheDraft, SuffixCache, common_prefix
from avkit.hvd.token_classes import CLASSES
from avkit.trace.reader import read_generations, read_traces


@dataclass(frozen=True)
class ReplayGeneration:
    request_id: str
    dataset: str
    prompt_ids: list[int]
    output_ids: list[int]
    model_match: np.ndarray  # [N] bool, draft argmax == output[t] teacher-forced


def _draft_rows(cache: SuffixCache, gen: ReplayGeneration, k: int, classes: np.ndarray | None) -> dict:
    """Walk one generation token by token: draft, score against output[t:], then append output[t]."""
    out, n = gen.output_ids, len(gen.output_ids)
    cols = {c: np.zeros(n) for c in (*CacheDraft().features(), "cache_acc", "in_prompt", "in_output")}
    draft_cls = np.zeros((n, len(CLASSES)))
    in_prompt, in_output = SubstringIndex(gen.prompt_ids), SubstringIndex()  # the copy features, as live
    full, p = list(gen.prompt_ids) + list(out), len(gen.prompt_ids)
    cache.start_request(gen.request_id, gen.prompt_ids)
    for t in range(n):
        d = cache.draft(gen.request_id, k)
        if d.tokens:
            tail = full[p + t - d.match_len: p + t] + d.tokens
            for name, v in d.features().items():
                cols[name][t] = v
            cols["cache_acc"][t] = common_prefix(d.tokens, out[t:t + d.draft_len])  # <= K compares
            cols["in_prompt"][t] = in_prompt.contains(tail)
            cols["in_output"][t] = in_output.contains(tail)  # output[:t]
            if classes is not None:
                draft_cls[t] = classes[d.tokens].mean(axis=0)
        cache.append(gen.request_id, [out[t]])
        in_output.append(out[t])
    cache.finish_request(gen.request_id)
    cols["draft_classes"] = draft_cls
    return cols


def replay(gens: list[ReplayGeneration], cache_config: SuffixCacheConfig = SuffixCacheConfig(),
           config: HvdReplayConfig = HvdReplayConfig(), classes: np.ndarray | None = None,
           progress: bool = False) -> pl.DataFrame:
    """One row per (request, position) in generation order; the global tree fills in that order."""
    from rich.progress import track  # lazy: rich (progress bar only on a terminal)

    cache = SuffixCache(cache_config)
    frames = []
    it = track(gens, description="hvd replay", transient=True) if progress else gens
    for gen in it:
        n = len(gen.output_ids)
        if n == 0:
            continue
        cols = _draft_rows(cache, gen, config.k, classes)
        model_match = np.asarray(gen.model_match, dtype=bool)
        model_acc = accept_lengths(model_match, config.k)
        t = np.arange(n)
        ctx = np.r_[gen.prompt_ids[-1:] or [0], gen.output_ids[:-1]].astype(np.int64)  # token before t
        cols.update(history_features(cols["cache_acc"], model_match, model_acc, config.history_window))
        cols.update(structure_features(cols.pop("draft_classes"), ctx, classes))
        cols.update(log_position=np.log1p(t), log_prompt_len=np.full(n, np.log1p(len(gen.prompt_ids))))
        frames.append(pl.DataFrame({"request_id": [gen.request_id] * n, "dataset": [gen.dataset] * n, "t": t,
                                    "model_acc": model_acc, "model_match": model_match, **cols}))
    if not frames:
        raise TraceError("hvd replay: no generation with output tokens")
    return pl.concat(frames).with_columns(pl.col("cache_acc", "draft_len", "match_len").cast(pl.Int64))


def load_generations(trace_paths: list[str | Path]) -> tuple[list[ReplayGeneration], dict]:
    """Generations beside each trace, with model matches from the trace. Returns (gens, info)."""
    gens: list[ReplayGeneration] = []
    info = {"unknown_model_positions": [], "temperatures": set()}
    for path in map(Path, trace_paths):
        table = read_generations(path)
        trace = read_traces([path], ["request_id", "step", "position", "draft_token", "num_accepted", "drafter",
                                     "temperature"]).with_columns(pl.col("request_id", "drafter").cast(pl.String))
        info["temperatures"] |= set(trace["temperature"].unique().to_list())
        match, known = matches_from_trace(trace, table)
        n_known = sum(int(k.sum()) for k in known.values())
        info["unknown_model_positions"].append(1.0 - n_known / max(sum(len(k) for k in known.values()), 1))
        for row in table.iter_rows(named=True):
            gens.append(ReplayGeneration(f"{path.stem}/{row['request_id']}", row["dataset"],
                                         list(row["prompt_ids"]), list(row["output_ids"]), match[row["request_id"]]))
    return gens, info


def evaluate(table: pl.DataFrame, routes: dict[str, Route], cost: HvdCost, k: int,
             high: int = 6, predictions: dict[str, np.ndarray] | None = None) -> pl.DataFrame:
    """Metrics of every route per dataset and overall, with speedups over `model` and `cache` routes
    (which must be among `routes`) and over target-only decoding (throughput 1). Columns c_draft,
    c_verify, c_cache state the cost model (`HvdCost`, in target forwards) the speedups assume.
    Precision / recall of high-payoff drafts compare `predictions[name] >= high` (the predicted
    payoff, as the paper does) with the oracle `cache_acc >= high`; routers without a prediction
    are scored on their decision (cache chosen)."""
    rows = []
    datasets = table["dataset"].to_numpy()
    for name, route in routes.items():
        paths = simulate_paths(table, route, cost, k)
        per = pl.concat([path_metrics(paths, "dataset"), path_metrics(paths)], how="diagonal")
        flag = predictions[name] >= high if predictions and name in predictions else route.use_cache
        prs = [precision_recall(table.filter(pl.col("dataset") == d) if d != "overall" else table,
                                flag[datasets == d] if d != "overall" else flag, high) for d in per["dataset"]]
        rows.append(per.with_columns(router=pl.lit(name), precision=pl.Series([p for p, _ in prs]),
                                     recall=pl.Series([r for _, r in prs])))
    res = pl.concat(rows, how="diagonal")
    base = res.select("dataset", "router", "throughput")
    for ref in ("model", "suffix"):
        tp = base.filter(pl.col("router") == ref).select("dataset", pl.col("throughput").alias(f"tp_{ref}"))
        res = res.join(tp, on="dataset", how="left").with_columns(
            (pl.col("throughput") / pl.col(f"tp_{ref}")).alias(f"speedup_vs_{ref}")).drop(f"tp_{ref}")
    # the cost model beside every row: a reader of the table alone knows what the speedups assume
    return res.with_columns(speedup_vs_target=pl.col("throughput"), c_draft=pl.lit(cost.draft_step_cost),
                            c_verify=pl.lit(cost.verify_token_cost), c_cache=pl.lit(cost.cache_cost)).select(
        "router", "dataset", "tokens", "cycles_per_1k", "mean_accepted", "cache_share", "precision", "recall",
        "throughput", "speedup_vs_model", "speedup_vs_suffix", "speedup_vs_target", "c_draft", "c_verify", "c_cache")
