"""The batch fit over shards: pass 0 makes the shards, then passes of map (per shard: sums) and reduce (+=).

  shard   the unit of work of every pass (`Shard`, fit/spill.py). Held (`--engine memory`): every observed
          slot in RAM, sorted by position, in chunks of HELD_CHUNK rows. Spilled (`--engine streaming` /
          `ray`): one trace file, its observed slots spilled per column by pass 0
  chunk   (index, [K] rows per position, [n] positions, [n] labels, [n] dataset codes), rows sorted by
          position: each position's rows sum as one segment (`irls.fused_segment_stats`)
  pass    a map of `shard_pass` (additive sums of one shard) on an engine (fit/engines.py: threads or
          Ray), then a reduce (+=); one shard alone is mapped once per estimator instead
Batch IRLS (DESIGN.md §3, estimators/irls.py): each Newton iteration is one pass summing the O(K)
arrowhead statistics of every feature not yet converged; the driver takes the step (`batch_step`).
Every engine reaches the same fixed point (only the order of the sums differs). Scores: one last pass,
exact for a held shard (metrics/table.py), additive sums for spilled ones (metrics/binned.py).
Memory out of core: `workers` chunks in flight, `chunk_rows` = the budget left after FIXED_MB, shared
by the workers, over BYTES_PER_ROW (measured with `bench/fit.py --scale`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avkit.config import FitConfig
from avkit.estimators.irls import IrlsStats, newton_iterations
from avkit.features import FEATURES
from avkit.fit.data import FitData, load_fit_data, no_observed, trained_on
from avkit.fit.replay import coef_row
from avkit.fit.spill import Shard, spill_shard
from avkit.metrics.binned import BinnedScores, logit, quantile_edges
from avkit.trace.reader import trace_k
from avkit.trace.shards import ShardSet

SAMPLE_SLOTS = 1 << 21  # observed slots sampled over all shards in pass 0: the AUC bins' quantiles
BYTES_PER_ROW = 1024  # working memory per chunk row (all trace columns read and checked in pass 0)
FIXED_MB = 512  # interpreter, libraries, score histograms

Progress = Callable[[str, int, int], None]  # (what, done, total)


def chunk_rows(fit: FitConfig) -> int:
    """Rows per chunk so that `fit.workers` chunks in flight stay inside the memory budget."""
    share = max(64, fit.memory_budget - FIXED_MB) * (1 << 20) // fit.workers
    return max(1 << 15, share // BYTES_PER_ROW)


@dataclass
class PassWork:
    """One pass: predict with each estimator on its feature; IRLS sums, or score sums when `score`."""

    features: list[str]  # [E] feature of each estimator
    estimators: list  # [E] estimators at their current coefficients
    k: int
    dataset_names: list[str]  # global dataset codes
    score: dict | None = None  # {"n_bins", "edges": [E] AUC bin edges of logit(p) (None: a held shard's)}
    subsets: list[int | None] | None = None  # [E] fit estimator j on dataset code subsets[j] only (None: all)


def shard_pass(shard, work: PassWork, only: int | None = None) -> list:
    """Map step over one shard -> [E] additive sums (IrlsStats, or BinnedScores) of every estimator (`only`:
    of estimator `only` alone); a held shard's scores are its score rows."""
    k, sc = work.k, work.score
    picks = range(len(work.estimators)) if only is None else [only]
    if sc and shard.layout is not None:  # held: every slot predicted in one call, scored exactly
        pos = shard.held["position"]
        return [shard.layout.score(work.estimators[j].predict(shard.held[work.features[j]], pos)) for j in picks]
    counts_dtype = np.int32 if shard.observed < 1 << 31 else np.int64  # one shard's counts
    out = [BinnedScores.zeros(len(work.dataset_names), k, sc["n_bins"], sc["edges"][j], counts_dtype) if sc
           else IrlsStats.zeros(k) for j in picks]
    for c, counts, pos, y, ds in shard.chunks(k, work.dataset_names):
        group = ds * k + pos if sc else None  # [n] score group of each row (scoring passes only)
        cache: dict[str, np.ndarray] = {}
        for acc, j in zip(out, picks):
            name, est = work.features[j], work.estimators[j]
            if name not in cache:
                cache[name] = shard.column(c, name, np.float64)  # [n]
            f = cache[name]
            if sc:
                acc.add(est.predict(f, pos), y, group)  # [n] predictions at the fitted coefficients
                continue
            subset = work.subsets[j] if work.subsets else None  # one dataset's rows (still grouped by position)
            acc += est.newton_stats(f, y, pos, counts, None if subset is None else ds == subset)
    return out


def _add(total: list, part: list) -> list:
    """Fold of a pass: one shard's sums into the total."""
    for acc, x in zip(total, part):
        acc += x
    return total


def pass_sums(engine, shards: list, nodes, work: PassWork) -> list:
    """One pass -> [E] sums over every shard (one shard alone: mapped once per estimator)."""
    if len(shards) == 1:
        e = len(work.estimators)
        parts = engine.map(shard_pass, [(shards[0], work, j) for j in range(e)], nodes and nodes * e)[0]
        return [x for part in parts for x in part]
    return engine.map(shard_pass, [(s, work) for s in shards], nodes, fold=_add)[0]


def _edges(est, name: str, surveys: list[Shard], bins: int) -> np.ndarray:
    """AUC rank-bin edges of one estimator: quantiles of its logits on the shards' samples."""
    f = np.concatenate([s.sample[name] for s in surveys])  # [S]
    pos = np.concatenate([s.sample_positions for s in surveys])
    return quantile_edges(logit(est.predict(f, pos)), bins) if f.size else np.zeros(0)


def _merge_surveys(surveys: list[Shard], k: int | None, shards: ShardSet) -> dict:
    names = sorted({n for s in surveys for n in s.datasets})
    num_positions = max([k or 0] + [s.num_positions for s in surveys])
    present = [n for n in FEATURES if all(s.nulls[n] == 0 for s in surveys)]
    datasets = {n: sum(s.datasets.get(n, 0) for s in surveys) for n in names}
    observed = sum(s.observed for s in surveys)
    return {"names": names, "k": num_positions, "present": present, "observed": observed,
            "trained_on": trained_on(shards.paths, shards.meta, sum(s.rows for s in surveys), observed, datasets,
                                     "model", [s.clock for s in surveys], sum(s.steps for s in surveys))}


def newton(engine, shards, nodes, plan, ests, m, fit: FitConfig, progress,
           subsets: list[int | None] | None = None) -> dict[int, list[dict]]:
    """Batch IRLS of every fitted estimator (i on dataset code subsets[i] when given), one pass per
    iteration; -> index -> trajectory rows."""
    fitted = [i for i, (name, _) in enumerate(plan) if FEATURES[name].no_fit is None]
    rows: dict[int, list[dict]] = {i: [] for i in fitted}
    passes = iter(range(1, fit.max_iter + 1))

    def stats_of(active: list[int]) -> list:  # one pass over every shard for the estimators still moving
        work = PassWork([plan[fitted[j]][0] for j in active], [ests[fitted[j]] for j in active], m["k"], m["names"],
                        subsets=None if subsets is None else [subsets[fitted[j]] for j in active])
        stats = pass_sums(engine, shards, nodes, work)
        if progress is not None:
            progress("newton iterations", next(passes), fit.max_iter)
        return stats

    def on_step(j: int, it: int) -> None:
        rows[fitted[j]].append(coef_row(ests[fitted[j]], it, None, True, m["observed"]))

    newton_iterations([ests[i] for i in fitted], stats_of, fit.max_iter, fit.tol, on_step)
    return rows


def score_pass(engine, shards, nodes, plan, ests, m, fit: FitConfig) -> list[list[dict]]:
    """One pass scoring every estimator at its coefficients -> [E] score rows (metrics/table.py's scopes)."""
    held = shards[0].layout is not None
    edges = [None] * len(plan) if held else [_edges(e, n, shards, fit.auc_bins) for (n, _), e in zip(plan, ests)]
    work = PassWork([n for n, _ in plan], ests, m["k"], m["names"], score={"n_bins": fit.bins, "edges": edges})
    sums = pass_sums(engine, shards, nodes, work)
    return sums if held else [acc.rows(m["names"]) for acc in sums]


@contextmanager
def held(shards: ShardSet, fit: FitConfig, data: FitData | None = None):
    """Pass 0 in memory (fit/data.py, or `data`, whose features move to the shard) -> ([Shard], None, summary)."""
    data = load_fit_data(shards.paths, fit.drafter, fit.features or None) if data is None else data
    m = {"names": data.dataset_names, "k": data.k, "present": list(data.features), "observed": data.labels.size,
         "trained_on": data.trained_on}
    shard = Shard.of(data, fit.bins)
    del data  # (the shard holds what the passes read)
    yield [shard], None, m


@contextmanager
def spilled(engine, shards: ShardSet, fit: FitConfig, drafts: bool = False):
    """Pass 0 over every shard (`spill_shard`) into `fit.scratch` (else the system's temp) -> (surveys, node of
    each, their merge); removed on exit on every node that wrote one (`engine.cleanup`)."""
    if fit.scratch is not None:
        Path(fit.scratch).mkdir(parents=True, exist_ok=True)
    scratch, nodes, paths = tempfile.mkdtemp(prefix="avkit-spill-", dir=fit.scratch), None, shards.paths
    try:
        sample = max(1024, SAMPLE_SLOTS // len(paths))  # per shard
        ks = [trace_k(p) for p in paths]  # K may differ across shards: each is checked at its own
        items = [(str(p), i, k, scratch, chunk_rows(fit), sample, drafts) for i, (p, k) in enumerate(zip(paths, ks))]
        surveys, nodes = engine.map(spill_shard, items)
        m = _merge_surveys(surveys, max([k for k in ks if k] or [0]) or None, shards)
        if m["observed"] == 0:
            raise no_observed(paths, "model")
        yield surveys, nodes, m
    finally:
        engine.cleanup(scratch, nodes)
