"""`avkit fit` as a library call: one fit over the trace shards, its map on threads or on Ray.

For each feature of `avkit.features.FEATURES` present in the traces: a feature that already is
a probability is scored by its no-fit estimator (q_max -> `qmax`, head_conf -> `passthrough`);
every other feature is fitted with `--estimator` (online mode, `online_logistic` by default:
replayed in refit rounds as live) or `batch_logistic` (batch mode). The chosen feature is also fitted with the
`per_position_slope` ablation. Lossy features are scored (flagged lossless = false) but never
written to coefficients.json, the file `serve` deploys.

The observed slots are held in memory (`--engine memory`: exact AUC; the features are fitted and
scored on `fit.workers` threads, the replicas of `--replicas independent` on the engine), or, for
`--mode batch` on `--engine streaming` / `ray`, summed pass by pass over the spilled shards
(fit/streaming.py). Both give (plan, estimators, trajectory rows, score rows, K, trained_on), and
`run_fit` turns that into one FitResult.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from contextlib import nullcontext

from threadpoolctl import threadpool_limits

from avkit.config import EstimatorConfig, FitConfig
from avkit.features import FEATURES
from avkit.fit.data import load_fit_data
from avkit.fit.engines import LocalEngine, open_engine
from avkit.fit.plan import FitResult, check_features, coefficients_doc, plan_features, start_estimator
from avkit.fit.replay import batch_fit, online_replay, online_replicas, trajectory_frame
from avkit.fit.streaming import fit_passes
from avkit.metrics.table import ScoreLayout
from avkit.trace.shards import check_shards

Progress = Callable[[str, int, int], None]  # (what, done, total)


def run_fit(paths, fit: FitConfig | None = None, est_cfg: EstimatorConfig | None = None,
            progress: Progress | None = None, engine=None) -> FitResult:
    """Fit and score every feature of the traces at `paths`; nothing is written here. `engine`: where the
    map runs (default: the one `fit.engine` names, fit/engines.py)."""
    fit, est_cfg = fit or FitConfig(), est_cfg or EstimatorConfig()
    check_features(fit, est_cfg)
    fitter = fit_passes if fit.mode == "batch" and fit.engine != "memory" else _fit_in_memory
    with nullcontext(engine) if engine is not None else open_engine(fit) as engine:
        plan, ests, rows, tables, k, trained_on = fitter(paths, fit, est_cfg, progress, engine)
    scores = [{"feature": n, "lossless": FEATURES[n].lossless, "estimator": e, **row}
              for (n, e), table in zip(plan, tables) for row in table]
    i = next(i for i, (n, _) in enumerate(plan) if n == est_cfg.feature)
    return FitResult(coefficients_doc(ests[i], k, trained_on, fit, est_cfg), scores,
                     trajectory_frame(rows[i], k, hasattr(ests[i], "slopes")))


def _fit_in_memory(paths, fit: FitConfig, est_cfg: EstimatorConfig, progress: Progress | None, engine):
    data = load_fit_data(check_shards(paths).paths, fit.drafter, fit.features or None)
    plan = plan_features(fit, est_cfg, data.features)
    ests = [start_estimator(n, e, data.k, data.trained_on, fit, est_cfg) for n, e in plan]
    layout = ScoreLayout(data.labels, data.positions, data.dataset_codes, data.dataset_names, fit.bins)
    fitted = {}  # plan index -> (written estimator, predictions, rows) of each replica-replayed feature
    if fit.replicas == "independent":  # one map over (feature, replica) on the engine: threads or Ray
        todo = [i for i, (n, _) in enumerate(plan) if FEATURES[n].no_fit is None]
        fitted = dict(zip(todo, online_replicas([ests[i] for i in todo], [data.features[plan[i][0]] for i in todo],
                                                data, engine)))
    if fit.mode == "batch":
        data.position_order  # noqa: B018 (one sort by position, shared by every feature's fit)
    done = itertools.count(1)

    def job(i: int):
        name, estimator = plan[i]
        est, values = ests[i], data.features[name]
        if i in fitted:
            est, preds, rows = fitted[i]
        elif FEATURES[name].no_fit is not None:
            preds, rows = est.predict(values, data.positions), []
        elif fit.mode == "batch":  # (the estimator orients the feature by FeatureSpec.sign itself)
            preds, rows = batch_fit(est, data, values, max_iter=fit.max_iter, tol=fit.tol)
        else:
            on_round = None if progress is None else (lambda d, t: progress(f"{name} ({estimator})", d, t))
            preds, rows = online_replay(est, data, values, on_round)
        if progress is not None:
            progress("features", next(done), len(plan))
        return est, rows, layout.score(preds)

    # Features are independent and numpy/polars release the GIL on large arrays: they run on
    # `fit.workers` threads, results in plan order (deterministic). BLAS runs one thread per caller
    # (the workers are the parallelism): several threads calling a multi-threaded OpenBLAS on a
    # small box oversubscribe the cores with spinning BLAS threads.
    with threadpool_limits(limits=1, user_api="blas"):
        ests, rows, tables = zip(*LocalEngine(fit.workers).map(job, [(i,) for i in range(len(plan))])[0])
    return plan, ests, rows, tables, data.k, data.trained_on


__all__ = ["FitResult", "plan_features", "run_fit"]
