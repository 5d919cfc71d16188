"""`avkit fit` as a library call: fit the chosen estimator on every feature and score it.

For each feature of `avkit.features.FEATURES` present in the traces: a feature that already is
a probability is scored by its no-fit estimator (q_max -> `qmax`, head_conf -> `passthrough`);
every other feature is fitted with `--estimator` (online mode, `online_logistic` by default:
replayed in refit rounds as live) or `batch_logistic` (batch mode). The chosen feature is also fitted with the
`per_position_slope` ablation. Lossy features are scored (flagged lossless = false) but never
written to coefficients.json, the file `serve` deploys.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from threadpoolctl import threadpool_limits

from avkit.config import EstimatorConfig, FitConfig
from avkit.features import FEATURES
from avkit.fit.data import FitData, load_fit_data
from avkit.fit.engines import open_engine
from avkit.fit.plan import FitResult, check_features, coefficients_doc, plan_features, start_estimator
from avkit.fit.replay import batch_fit, online_replay, trajectory_frame
from avkit.fit.replicas import online_replicas
from avkit.fit.streaming import fit_streaming
from avkit.metrics.table import ScoreLayout
from avkit.trace.shards import check_shards

Progress = Callable[[str, int, int], None]  # (what, done, total)


def _fit_one(name: str, estimator: str, data: FitData, fit: FitConfig, est_cfg: EstimatorConfig,
             progress: Progress | None):
    """-> (estimator, predictions [N], trajectory rows) for one feature."""
    spec = FEATURES[name]
    values = data.features[name]
    est = start_estimator(name, estimator, data, fit, est_cfg)
    if spec.no_fit is not None:
        return est, est.predict(values, data.positions), []
    if fit.mode == "batch":  # (the estimator orients the feature by FeatureSpec.sign itself)
        preds, rows = batch_fit(est, data, values, max_iter=fit.max_iter, tol=fit.tol)
    else:
        on_round = None if progress is None else (lambda d, t: progress(f"{name} ({estimator})", d, t))
        preds, rows = online_replay(est, data, values, on_round)
    return est, preds, rows


def run_fit(paths, fit: FitConfig | None = None, est_cfg: EstimatorConfig | None = None,
            progress: Progress | None = None) -> FitResult:
    """Fit and score every feature of the traces at `paths`; nothing is written here."""
    fit, est_cfg = fit or FitConfig(), est_cfg or EstimatorConfig()
    check_features(fit, est_cfg)
    if fit.mode == "batch" and fit.engine != "memory":  # out of core, on this machine or a Ray cluster
        with open_engine(fit) as engine:
            return fit_streaming(paths, fit, est_cfg, progress, engine=engine)
    data = load_fit_data(check_shards(paths).paths, fit.drafter, fit.features or None)
    plan = plan_features(fit, est_cfg, data.features)
    layout = ScoreLayout(data.labels, data.positions, data.dataset_codes, data.dataset_names, fit.n_bins)
    fitted = _replay_replicas(plan, data, fit, est_cfg) if fit.replicas == "independent" else {}

    def job(item: tuple[str, str]):
        name, estimator = item
        est, preds, rows = fitted.get(item) or _fit_one(name, estimator, data, fit, est_cfg, progress)
        table = [{"feature": name, "lossless": FEATURES[name].lossless, "estimator": estimator, **row}
                 for row in layout.score(preds)]
        return est, rows, table

    if fit.mode == "batch":
        data.position_order  # noqa: B018 (one sort by position, shared by every feature's fit)
    # Features are independent and numpy/polars release the GIL on large arrays: score them on
    # `fit.workers` threads; results come back in plan order, so the output is deterministic.
    # BLAS runs one thread per caller (the workers are the parallelism): several threads calling a
    # multi-threaded OpenBLAS on a small box oversubscribe the cores with spinning BLAS threads.
    scores, chosen = [], None
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(max_workers=fit.workers) as pool:
        for i, ((name, _), (est, rows, table)) in enumerate(zip(plan, pool.map(job, plan))):
            scores += table
            if chosen is None and name == est_cfg.feature:
                chosen = (est, rows)
            if progress is not None:
                progress("features", i + 1, len(plan))
    est, rows = chosen
    return FitResult(coefficients_doc(est, data.k, data.trained_on, data.clock, fit, est_cfg), scores,
                     trajectory_frame(rows, data.k, hasattr(est, "slopes")))


def _replay_replicas(plan, data: FitData, fit: FitConfig, est_cfg: EstimatorConfig) -> dict:
    """(feature, estimator) -> (written estimator, predictions, rows) of every fitted feature, each
    replica on its own estimator (fit/replicas.py), on Ray (`--engine ray`) or this machine's threads."""
    todo = [(n, e) for n, e in plan if FEATURES[n].no_fit is None]
    starts = [start_estimator(n, e, data, fit, est_cfg) for n, e in todo]
    features = [data.features[n] for n, _ in todo]
    with open_engine(fit) as engine:  # Ray (`--engine ray`) or this machine's threads
        return dict(zip(todo, online_replicas(starts, features, data, engine)))


__all__ = ["FitResult", "plan_features", "run_fit"]
