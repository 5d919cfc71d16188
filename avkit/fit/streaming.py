"""Batch fit and feature scores out of core: passes over the shards in bounded chunks, summed.

Glossary:
  shard   one trace file (a replica's run): the unit of work of every pass
  spill   pass 0 (`fit/spill.py`) reads each shard once in chunks of `chunk_rows` rows, checks
          them and spills the observed slots' features per column; later passes sum each
          position's rows as one contiguous segment (`irls.fused_segment_stats`: one fused pass)
  survey  what pass 0 learns about a shard (`ShardSurvey`), with a uniform sample of its
          observed slots (the AUC histogram's bin edges: metrics/binned.py)
  pass    a map over shards of a function of one shard's chunks that returns additive sums,
          then a reduce (+=) on the driver. An engine runs the map: `LocalEngine` on this
          machine's threads, `RayEngine` (fit/engines.py) as tasks on a Ray cluster; the
          driver (`fit_passes`, called by `run_fit`) is the same for both
Batch IRLS (DESIGN.md §3, estimators/irls.py): each Newton iteration is one pass summing, for
every feature not yet converged, the O(K) arrowhead statistics at its current coefficients; the
driver takes the step (`RoundLogistic.batch_step`). The fixed point is the in-memory fit's: only
the order of the sums differs. Scores: one last pass sums `metrics/binned.py` for every feature.
Memory: a pass holds `workers` chunks at once; `chunk_rows` = the budget left after FIXED_MB,
shared by the workers, over BYTES_PER_ROW (read columns, derived features, predictions and
temporaries of one row; measured with `bench/fit.py --scale`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from avkit.config import EstimatorConfig, FitConfig
from avkit.errors import TraceError
from avkit.estimators import make_estimator
from avkit.estimators.irls import IrlsStats, grouped_segments, newton_iterations
from avkit.features import FEATURES
from avkit.fit.data import trained_on
from avkit.fit.replay import coef_row
from avkit.fit.spill import ShardSurvey, spill_shard
from avkit.metrics.binned import BinnedScores, logit, quantile_edges
from avkit.trace.reader import trace_k
from avkit.trace.shards import check_shards

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
    score: dict | None = None  # {"n_bins", "edges": [E] AUC bin edges of logit(p)}
    subsets: list[int | None] | None = None  # [E] fit estimator j on dataset code subsets[j] only (None: all)


def shard_pass(survey: ShardSurvey, work: PassWork) -> list:
    """Map step of a pass over one shard's spill -> [E] additive sums (IrlsStats or BinnedScores)."""
    k, sc = work.k, work.score
    count_type = np.int32 if survey.observed < 1 << 31 else np.int64  # a shard's counts (the total's: int64)
    out = [BinnedScores.zeros(len(work.dataset_names), k, sc["n_bins"], edges, count_type) for edges in sc["edges"]] \
        if sc else [IrlsStats.zeros(k) for _ in work.estimators]
    for c, counts, pos, y, ds in survey.spilled(k, work.dataset_names):
        bounds = np.r_[0, np.cumsum(counts)]  # [K + 1]
        group = ds * k + pos  # [n]
        cache: dict[str, np.ndarray] = {}
        for j, (name, est) in enumerate(zip(work.features, work.estimators)):
            if name not in cache:
                cache[name] = survey.column(c, name, np.float64)  # [n]
            f = cache[name]
            if sc:
                out[j].add(est.predict(f, pos), y, group)  # [n] predictions at the fitted coefficients
                continue
            fo, yj, cj, bj = est.oriented(f), y, counts, bounds  # oriented as the estimator fits it
            if work.subsets and work.subsets[j] is not None:  # one dataset's rows (still grouped by position)
                keep = ds == work.subsets[j]
                fo, yj, cj = fo[keep], y[keep], np.bincount(pos[keep], minlength=k)
                bj = np.r_[0, np.cumsum(cj)]
            out[j] += est.newton_stats(grouped_segments(fo, yj, None, bj), cj)  # as the in-memory fit
    return out


def _add(total: list, part: list) -> list:
    """Fold of a pass: add one shard's sums (a list of IrlsStats or BinnedScores) into the total."""
    for acc, x in zip(total, part):
        acc += x
    return total


def _edges(est, name: str, surveys: list[ShardSurvey], bins: int) -> np.ndarray:
    """AUC rank-bin edges of one estimator: quantiles of its logits on the shards' samples."""
    f = np.concatenate([s.sample[name] for s in surveys])  # [S]
    pos = np.concatenate([s.sample_positions for s in surveys])
    return quantile_edges(logit(est.predict(f, pos)), bins) if f.size else np.zeros(0)


def _merge_surveys(surveys: list[ShardSurvey], k: int | None) -> dict:
    names = sorted({n for s in surveys for n in s.datasets})
    num_positions = max([k or 0] + [s.num_positions for s in surveys])
    present = [n for n in FEATURES if all(s.nulls[n] == 0 for s in surveys)]
    datasets = {n: sum(s.datasets.get(n, 0) for s in surveys) for n in names}
    clocks = ["engine_step" if s.all_step_nulls == 0 else "request_step" for s in surveys]
    steps = sum(s.steps_by_engine_step if c == "engine_step" else s.steps_by_request for s, c in zip(surveys, clocks))
    return {"names": names, "k": num_positions, "present": present, "clocks": clocks, "engine_steps": steps,
            "datasets": datasets, "observed": sum(s.observed for s in surveys),
            "rows": sum(s.rows for s in surveys)}


def newton(engine, surveys, nodes, plan, ests, m, fit: FitConfig, progress,
            subsets: list[int | None] | None = None) -> dict[int, list[dict]]:
    """Batch IRLS of every fitted estimator (estimator i on dataset code subsets[i] when given), one pass
    per iteration; -> index -> trajectory rows."""
    fitted = [i for i, (name, _) in enumerate(plan) if FEATURES[name].no_fit is None]
    rows: dict[int, list[dict]] = {i: [] for i in fitted}
    passes = iter(range(1, fit.max_iter + 1))

    def stats_of(active: list[int]) -> list:  # one pass over every shard for the estimators still moving
        work = PassWork([plan[fitted[j]][0] for j in active], [ests[fitted[j]] for j in active], m["k"], m["names"],
                        subsets=None if subsets is None else [subsets[fitted[j]] for j in active])
        stats = engine.map(shard_pass, [(s, work) for s in surveys], nodes, fold=_add)[0]
        if progress is not None:
            progress("newton iterations", next(passes), fit.max_iter)
        return stats

    def on_step(j: int, it: int) -> None:
        rows[fitted[j]].append(coef_row(ests[fitted[j]], it, None, True, m["observed"]))

    newton_iterations([ests[i] for i in fitted], stats_of, fit.max_iter, fit.tol, on_step)
    return rows


@contextmanager
def spilled(engine, paths: list[Path], fit: FitConfig, drafts: bool = False):
    """Pass 0 over every shard (`spill_shard`) into a scratch directory (`fit.scratch`, else the system's
    temp) -> (surveys, node of each, their merge); TraceError when no slot is observed. The spills are
    removed on exit, on every node that wrote one (`engine.cleanup`)."""
    if fit.scratch is not None:
        Path(fit.scratch).mkdir(parents=True, exist_ok=True)
    scratch, nodes = tempfile.mkdtemp(prefix="avkit-spill-", dir=fit.scratch), None
    try:
        sample = max(1024, SAMPLE_SLOTS // len(paths))  # per shard
        ks = [trace_k(p) for p in paths]  # K may differ across shards: each is checked at its own
        items = [(str(p), i, k, scratch, chunk_rows(fit), sample, drafts) for i, (p, k) in enumerate(zip(paths, ks))]
        surveys, nodes = engine.map(spill_shard, items)
        m = _merge_surveys(surveys, max([k for k in ks if k] or [0]) or None)
        if m["observed"] == 0:
            raise TraceError(f"{', '.join(map(str, paths))}: no observed labels (every `accepted` is null)")
        yield surveys, nodes, m
    finally:
        engine.cleanup(scratch, nodes)


def fit_passes(paths, fit: FitConfig, est_cfg: EstimatorConfig, progress: Progress | None, engine, plan_of):
    """`run_fit` out of core (`--mode batch`, engine streaming or ray): pass 0 spills, one Newton pass per
    iteration, one score pass; -> (plan, estimators, trajectory rows, score rows, K, trained_on) as the
    in-memory fit's, memory bounded by `fit.memory_budget` (AUC within each row's `auc_bound`)."""
    shards = check_shards(paths)
    with spilled(engine, shards.paths, fit) as (surveys, nodes, m):
        plan = plan_of(m["present"])  # [(feature, estimator)] for the features present (fit/run.py plan_features)
        ests = [make_estimator(e, k=m["k"], config=replace(est_cfg, feature=n)) for n, e in plan]
        rows = newton(engine, surveys, nodes, plan, ests, m, fit, progress)
        edges = [_edges(e, n, surveys, fit.auc_bins) for (n, _), e in zip(plan, ests)]
        work = PassWork([n for n, _ in plan], ests, m["k"], m["names"], score={"n_bins": fit.bins, "edges": edges})
        sums = engine.map(shard_pass, [(s, work) for s in surveys], nodes, fold=_add)[0]
    meta = trained_on(shards.paths, shards.meta, m["rows"], m["observed"], m["datasets"], "model", m["clocks"],
                      m["engine_steps"])
    return plan, ests, [rows.get(i, []) for i in range(len(plan))], [acc.rows(m["names"]) for acc in sums], \
        m["k"], meta


__all__ = ["PassWork", "chunk_rows", "fit_passes", "newton", "shard_pass", "spilled"]
