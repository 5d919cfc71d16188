"""`avkit fit` as a library call: what it runs, returns and writes.

Each feature of `avkit.features.FEATURES` in the traces (`plan_features`) is scored: a probability by its
no-fit estimator (q_max -> `qmax`, head_conf -> `passthrough`), every other fitted with `--estimator`
(online: replayed in refit rounds as live, fit/replay.py) or `batch_logistic` (batch: one fit over shards,
fit/passes.py); the written feature also with the `per_position_slope` ablation. Lossy features are
scored (lossless = false) but never written to coefficients.json, the file `serve` deploys.
`write_fit_outputs` writes atomically (all renamed at the end, or none):
  coefficients.json  the deployable estimator (`coefficients_doc`, schema_version 1), read by `serve`
  scores.json        rows {feature, lossless, estimator, scope, auc, log_loss, ece, n}
  trajectory.parquet slope and intercepts after every online refit (or batch iteration); `file` is
                     the index of the trace the round came from (engine steps restart per trace)
JSON has no NaN: undefined metrics (AUC of a one-class scope) are written as null.
"""

from __future__ import annotations

import itertools
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl
from threadpoolctl import threadpool_limits

from avkit.config import EstimatorConfig, FitConfig
from avkit.errors import ConfigError
from avkit.estimators import make_estimator
from avkit.estimators.coefficients import ServedPair, coefficients_document, load_estimator
from avkit.features import FEATURES
from avkit.fit.data import load_fit_data
from avkit.fit.engines import LocalEngine, open_engine
from avkit.fit.passes import Progress, held, newton, score_pass, spilled
from avkit.fit.replay import online_replay, online_replicas, trajectory_frame
from avkit.jsonsafe import dumps
from avkit.metrics.table import ScoreLayout
from avkit.provenance import inputs_record
from avkit.staged import StagedOutputs
from avkit.trace.shards import check_shards
from avkit.validate import check_choice

FILES = ("coefficients.json", "scores.json", "trajectory.parquet")


@dataclass
class FitResult:
    coefficients: dict  # the coefficients.json document
    scores: list[dict]  # the scores.json rows
    trajectory: pl.DataFrame  # one row per online refit (or batch iteration) of the chosen fit


def check_features(fit: FitConfig, est_cfg: EstimatorConfig) -> None:
    """The written feature (`--feature`) is fittable and lossless and, with `--features`, among those fitted."""
    name = check_choice("--feature", est_cfg.feature, FEATURES)
    spec = FEATURES[name]
    if spec.no_fit is not None:
        raise ConfigError(f"--feature {name}: is a probability scored with no fit ({spec.no_fit}); "
                          f"choose a feature to fit, e.g. 'logit_qmax'")
    if not spec.lossless:
        raise ConfigError(f"--feature {name}: is lossy (verifying by q(x_sampled) biases the output); "
                          f"it is scored in scores.json but never deployed")
    if fit.features and name not in fit.features:
        raise ConfigError(f"--features {','.join(fit.features)}: leaves out the written feature "
                          f"(--feature {name}, coefficients.json); add it")


def start_estimator(name: str, estimator: str, k: int, trained_on: dict, fit: FitConfig, est_cfg: EstimatorConfig):
    """The estimator a fit of feature `name` starts from: the start constants, or (online, the written
    feature and estimator) the state of `--coefficients`, through the one validated loader: K, the
    traces' model pair and the drafter fitted must match the file's (as a server restarting from its snapshot)."""
    config = replace(est_cfg, feature=name)
    if fit.coefficients and fit.mode == "online" and name == est_cfg.feature and estimator == fit.estimator:
        pair = ServedPair(*(trained_on.get(f, "") for f in ("target", "draft", "target_sha256", "draft_sha256")))
        return load_estimator(estimator, fit.coefficients, k=k, pair=pair, drafter=trained_on.get("drafter", "model"),
                              config=config)
    return make_estimator(estimator, k=k, config=config)


def plan_features(fit: FitConfig, est_cfg: EstimatorConfig, present) -> list[tuple[str, str]]:
    """(feature, estimator) of every fit `avkit fit` runs, for the features `present` in the traces: each
    present feature and the per-position-slope ablation of the written one, or only `fit.features`."""
    logistic = fit.estimator if fit.mode == "online" else "batch_logistic"
    if absent := [n for n in fit.features if n not in present]:
        raise ConfigError(f"--features {absent[0]}: is not in the traces (its columns are absent or "
                          f"hold nulls); the traces have {', '.join(n for n in FEATURES if n in present)}")
    plan = [(n, FEATURES[n].no_fit or logistic) for n in FEATURES if n in (fit.features or present)]
    return plan if fit.features else plan + [(est_cfg.feature, "per_position_slope")]


def coefficients_doc(est, trained_on: dict, fit: FitConfig, est_cfg: EstimatorConfig) -> dict:
    """The coefficients.json document of the fitted estimator, with the fit's settings and the traces by
    content hash (avkit/provenance.py: `avkit report` checks them)."""
    return coefficients_document(est, {**trained_on, "inputs": inputs_record(
        "avkit fit", trained_on["traces"], mode=fit.mode, feature=est_cfg.feature,
        refit_interval=est_cfg.refit_interval)}, mode=fit.mode, sign=True, settings={
        "refit_interval": est_cfg.refit_interval, "refits": int(est.rounds), "ridge": est_cfg.ridge,
        "damping": est_cfg.damping, "lossless": True,
        "clock": trained_on["clock"]})  # what counted engine steps: fit/data.py CLOCKS


def run_fit(paths, fit: FitConfig | None = None, est_cfg: EstimatorConfig | None = None,
            progress: Progress | None = None, engine=None) -> FitResult:
    """Fit and score every feature of the traces at `paths`; nothing is written here. `engine`: where the
    map runs (default: the one `fit.engine` names, fit/engines.py)."""
    fit, est_cfg = fit or FitConfig(), est_cfg or EstimatorConfig()
    check_features(fit, est_cfg)
    shards = check_shards(paths)
    # BLAS runs one thread per caller (the workers are the parallelism): several threads calling a
    # multi-threaded OpenBLAS on a small box oversubscribe the cores with spinning BLAS threads.
    with nullcontext(engine) if engine is not None else open_engine(fit) as engine, \
            threadpool_limits(limits=1, user_api="blas"):
        fitter = _fit_batch if fit.mode == "batch" else _fit_online
        plan, ests, rows, tables, k, trained_on = fitter(shards, fit, est_cfg, progress, engine)
    scores = [{"feature": n, "lossless": FEATURES[n].lossless, "estimator": e, **row}
              for (n, e), table in zip(plan, tables) for row in table]
    i = next(i for i, (n, _) in enumerate(plan) if n == est_cfg.feature)
    return FitResult(coefficients_doc(ests[i], trained_on, fit, est_cfg), scores,
                     trajectory_frame(rows[i], k, hasattr(ests[i], "slopes")))


def _fit_batch(shards, fit: FitConfig, est_cfg: EstimatorConfig, progress: Progress | None, engine):
    """Pass 0 (the slots held in memory, or spilled shard by shard), one pass per Newton iteration, one
    score pass; -> (plan, estimators, trajectory rows, score rows, K, trained_on)."""
    with held(shards, fit) if fit.engine == "memory" else spilled(engine, shards, fit) as (parts, nodes, m):
        plan = plan_features(fit, est_cfg, m["present"])
        ests = [start_estimator(n, e, m["k"], m["trained_on"], fit, est_cfg) for n, e in plan]
        rows = newton(engine, parts, nodes, plan, ests, m, fit, progress)
        tables = score_pass(engine, parts, nodes, plan, ests, m, fit)
    return plan, ests, [rows.get(i, []) for i in range(len(plan))], tables, m["k"], m["trained_on"]


def _fit_online(shards, fit: FitConfig, est_cfg: EstimatorConfig, progress: Progress | None, engine):
    """The online replay in memory: each feature replayed in engine-step order (or each replica on its
    own estimator, on the engine), scored exactly; -> as `_fit_batch`."""
    data = load_fit_data(shards.paths, fit.drafter, fit.features or None)
    plan = plan_features(fit, est_cfg, data.features)
    ests = [start_estimator(n, e, data.k, data.trained_on, fit, est_cfg) for n, e in plan]
    layout = ScoreLayout(data.labels, data.positions, data.dataset_codes, data.dataset_names, fit.bins)
    fitted = {}  # plan index -> (written estimator, predictions, rows) of each replica-replayed feature
    if fit.replicas == "independent":  # one map over (feature, replica) on the engine: threads or Ray
        todo = [i for i, (n, _) in enumerate(plan) if FEATURES[n].no_fit is None]
        fitted = dict(zip(todo, online_replicas([ests[i] for i in todo], [data.features[plan[i][0]] for i in todo],
                                                data, engine)))
    done = itertools.count(1)

    def job(i: int):
        name, estimator = plan[i]
        est, values = ests[i], data.features[name]
        if i in fitted:
            est, preds, rows = fitted[i]
        elif FEATURES[name].no_fit is not None:
            preds, rows = est.predict(values, data.positions), []
        else:
            on_round = None if progress is None else (lambda d, t: progress(f"{name} ({estimator})", d, t))
            preds, rows = online_replay(est, data, values, on_round)
        if progress is not None:
            progress("features", next(done), len(plan))
        return est, rows, layout.score(preds)

    # Features are independent and numpy/polars release the GIL on large arrays: they run on
    # `fit.workers` threads, results in plan order (deterministic).
    with LocalEngine(fit.workers) as local:
        ests, rows, tables = zip(*local.map(job, [(i,) for i in range(len(plan))])[0])
    return plan, ests, rows, tables, data.k, data.trained_on


def reserve_fit_outputs(out_dir, outputs: StagedOutputs, name: str = "--out") -> dict[str, Path]:
    """Reserve the three outputs in `out_dir` (checked writable now); -> name -> temp path."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{name} {out}: exists and is not a directory")
    return {f: outputs.file(out / f, name) for f in FILES}


def write_fit_outputs(out_dir, result: FitResult, outputs: StagedOutputs | None = None) -> dict[str, Path]:
    """Write the three outputs into `out_dir` (created if needed); -> name -> final path. With `outputs`
    they are only staged (the caller commits them with its other outputs)."""
    if outputs is None:
        with StagedOutputs() as own:
            return write_fit_outputs(out_dir, result, own)
    tmp = reserve_fit_outputs(out_dir, outputs)
    tmp["coefficients.json"].write_text(dumps(result.coefficients, indent=2) + "\n")
    tmp["scores.json"].write_text(dumps(result.scores, indent=1) + "\n")
    result.trajectory.write_parquet(tmp["trajectory.parquet"], compression="zstd")
    return {name: Path(out_dir).expanduser() / name for name in FILES}
