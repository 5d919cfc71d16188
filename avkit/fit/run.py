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
from dataclasses import dataclass, replace

import polars as pl
from threadpoolctl import threadpool_limits

from avkit.config import EstimatorConfig, FitConfig
from avkit.errors import ConfigError
from avkit.estimators import make_estimator
from avkit.features import FEATURES
from avkit.fit.data import FitData, load_fit_data
from avkit.fit.replay import batch_fit, online_replay, trajectory_frame
from avkit.metrics.table import ScoreLayout
from avkit.provenance import inputs_record
from avkit.trace.shards import check_shards

Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass
class FitResult:
    coefficients: dict  # the coefficients.json document
    scores: list[dict]  # the scores.json rows
    trajectory: pl.DataFrame  # one row per online refit (or batch iteration) of the chosen fit


def check_feature(name: str) -> None:
    if name not in FEATURES:
        raise ConfigError(f"--feature: unknown feature {name!r}; choose from {sorted(FEATURES)}")
    spec = FEATURES[name]
    if spec.no_fit is not None:
        raise ConfigError(f"--feature: {name!r} is a probability scored with no fit ({spec.no_fit}); "
                          f"choose a feature to fit, e.g. 'logit_qmax'")
    if not spec.lossless:
        raise ConfigError(f"--feature: {name!r} is lossy (verifying by q(x_sampled) biases the output); "
                          f"it is scored in scores.json but never deployed")


def check_features(fit: FitConfig, est_cfg: EstimatorConfig) -> None:
    """The written feature is fittable and, with `--features`, among the features fitted."""
    check_feature(est_cfg.feature)
    if fit.features and est_cfg.feature not in fit.features:
        raise ConfigError(f"--features: {','.join(fit.features)} leaves out the written feature "
                          f"--feature {est_cfg.feature!r} (coefficients.json); add it")


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


def start_estimator(name: str, estimator: str, data: FitData, fit: FitConfig, est_cfg: EstimatorConfig):
    """The estimator a fit of feature `name` starts from: the start constants, or (online, the written
    feature and estimator) the state of `--coefficients`."""
    if fit.coefficients and fit.mode == "online" and name == est_cfg.feature and estimator == fit.estimator:
        return warm_start(estimator, fit.coefficients, data, replace(est_cfg, feature=name))
    return make_estimator(estimator, k=data.k, config=replace(est_cfg, feature=name))


def warm_start(estimator: str, path: str, data: FitData, est_cfg: EstimatorConfig):
    """The written estimator resumed from a coefficients file (as a server restarting from its snapshot),
    through the one validated loader: K, the traces' model pair and the drafter fitted must match the file's."""
    from avkit.estimators.coefficients import ServedPair
    from avkit.estimators.named import load_estimator

    t = data.trained_on
    pair = ServedPair(t.get("target", ""), t.get("draft", ""), t.get("target_sha256", ""), t.get("draft_sha256", ""))
    return load_estimator(estimator, path, k=data.k, pair=pair, drafter=t.get("drafter", "model"), config=est_cfg)


def plan_features(fit: FitConfig, est_cfg: EstimatorConfig, present) -> list[tuple[str, str]]:
    """(feature, estimator) of every fit `avkit fit` runs, for the features `present` in the traces: each
    present feature and the per-position-slope ablation of the written one, or only `fit.features`."""
    logistic = fit.estimator if fit.mode == "online" else "batch_logistic"
    if fit.features:
        absent = [n for n in fit.features if n not in present]
        if absent:
            raise ConfigError(f"--features: {absent[0]!r} is not in the traces (its columns are absent or "
                              f"hold nulls); the traces have {[n for n in FEATURES if n in present]}")
        return [(n, FEATURES[n].no_fit or logistic) for n in FEATURES if n in fit.features]
    plan = [(n, FEATURES[n].no_fit or logistic) for n in FEATURES if n in present]
    return plan + [(est_cfg.feature, "per_position_slope")]


def run_fit(paths, fit: FitConfig | None = None, est_cfg: EstimatorConfig | None = None,
            progress: Progress | None = None) -> FitResult:
    """Fit and score every feature of the traces at `paths`; nothing is written here."""
    fit, est_cfg = fit or FitConfig(), est_cfg or EstimatorConfig()
    check_features(fit, est_cfg)
    if fit.mode == "batch" and fit.engine != "memory":  # out of core, on this machine or a Ray cluster
        from avkit.fit.distributed import fit_ray
        from avkit.fit.streaming import fit_streaming

        return (fit_ray if fit.engine == "ray" else fit_streaming)(paths, fit, est_cfg, progress)
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
    from avkit.fit.replicas import online_replicas
    from avkit.fit.streaming import LocalEngine

    todo = [(n, e) for n, e in plan if FEATURES[n].no_fit is None]
    starts = [start_estimator(n, e, data, fit, est_cfg) for n, e in todo]
    features = [data.features[n] for n, _ in todo]
    if fit.engine == "ray":
        from avkit.fit.distributed import RayEngine

        with RayEngine(fit.address, object_store_mb=min(1024, max(128, fit.memory_budget_mb // 2))) as engine:
            return dict(zip(todo, online_replicas(starts, features, data, engine)))
    return dict(zip(todo, online_replicas(starts, features, data, LocalEngine(fit.workers))))


def coefficients_doc(est, k: int, trained_on: dict, clock: str, fit: FitConfig, est_cfg: EstimatorConfig) -> dict:
    """The coefficients.json document of a fitted estimator."""
    return {
        **est.state_dict(),  # everything a warm start restores (forgetting_logistic: basis slopes, precision)
        "schema_version": 1,
        "feature": est_cfg.feature,
        "feature_sign": FEATURES[est_cfg.feature].sign,  # p = sigmoid(slope * sign * feature + b_i),
        # applied inside the estimator: load_state_dict(this file) into an estimator of this feature
        "num_positions": k,
        "slope": float(est.slope),
        "intercepts": [float(b) for b in est.intercepts],
        "observations": [int(n) for n in est.observations],
        "mode": fit.mode,
        "estimator": est.name,
        "refit_interval": est_cfg.refit_interval,
        "refits": int(est.rounds),
        "ridge": est_cfg.ridge,
        "damping": est_cfg.damping,
        "lossless": True,
        "clock": clock,  # what counted engine steps: fit/data.py CLOCKS
        # the traces by content hash and the settings (avkit/provenance.py): `avkit report` checks them
        "trained_on": {**trained_on, "inputs": inputs_record(
            "avkit fit", trained_on["traces"], mode=fit.mode, feature=est_cfg.feature,
            refit_interval=est_cfg.refit_interval)},
    }


__all__ = ["FitResult", "check_feature", "check_features", "coefficients_doc", "plan_features", "run_fit", "start_estimator"]
