"""What `avkit fit` runs, returns and writes, shared by every fit engine (in memory, out of core, Ray).

`plan_features` lists the (feature, estimator) fits for the features present in the traces,
`start_estimator` gives each fit its start state (a warm start from `--coefficients` for the
written one), `coefficients_doc` writes the deployable estimator as coefficients.json, and
`write_fit_outputs` writes the outputs atomically (`avkit.staged.StagedOutputs`: all renamed at the
end, or none):
  coefficients.json  the deployable estimator (schema_version 1), read by `serve`
  scores.json        rows {feature, lossless, estimator, scope, auc, log_loss, ece, n}
  trajectory.parquet slope and intercepts after every online refit (or batch iteration); `file` is
                     the index of the trace the round came from (engine steps restart per trace)
JSON has no NaN: undefined metrics (AUC of a one-class scope) are written as null. The fits
themselves import this module; it imports none of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from avkit.config import EstimatorConfig, FitConfig
from avkit.errors import ConfigError
from avkit.estimators import make_estimator
from avkit.estimators.coefficients import ServedPair, load_estimator
from avkit.features import FEATURES
from avkit.jsonsafe import json_safe
from avkit.provenance import inputs_record
from avkit.staged import StagedOutputs

FILES = ("coefficients.json", "scores.json", "trajectory.parquet")


@dataclass
class FitResult:
    coefficients: dict  # the coefficients.json document
    scores: list[dict]  # the scores.json rows
    trajectory: pl.DataFrame  # one row per online refit (or batch iteration) of the chosen fit


def check_feature(name: str) -> None:
    if name not in FEATURES:
        raise ConfigError(f"--feature must be one of {', '.join(FEATURES)}; got {name}")
    spec = FEATURES[name]
    if spec.no_fit is not None:
        raise ConfigError(f"--feature {name}: is a probability scored with no fit ({spec.no_fit}); "
                          f"choose a feature to fit, e.g. 'logit_qmax'")
    if not spec.lossless:
        raise ConfigError(f"--feature {name}: is lossy (verifying by q(x_sampled) biases the output); "
                          f"it is scored in scores.json but never deployed")


def check_features(fit: FitConfig, est_cfg: EstimatorConfig) -> None:
    """The written feature is fittable and, with `--features`, among the features fitted."""
    check_feature(est_cfg.feature)
    if fit.features and est_cfg.feature not in fit.features:
        raise ConfigError(f"--features {','.join(fit.features)}: leaves out the written feature "
                          f"(--feature {est_cfg.feature}, coefficients.json); add it")


def start_estimator(name: str, estimator: str, k: int, trained_on: dict, fit: FitConfig, est_cfg: EstimatorConfig):
    """The estimator a fit of feature `name` starts from: the start constants, or (online, the written
    feature and estimator) the state of `--coefficients`, through the one validated loader: K, the
    traces' model pair and the drafter fitted must match the file's (as a server restarting from its snapshot)."""
    config = replace(est_cfg, feature=name)
    if fit.coefficients and fit.mode == "online" and name == est_cfg.feature and estimator == fit.estimator:
        t = trained_on
        pair = ServedPair(t.get("target", ""), t.get("draft", ""), t.get("target_sha256", ""),
                          t.get("draft_sha256", ""))
        return load_estimator(estimator, fit.coefficients, k=k, pair=pair, drafter=t.get("drafter", "model"),
                              config=config)
    return make_estimator(estimator, k=k, config=config)


def plan_features(fit: FitConfig, est_cfg: EstimatorConfig, present) -> list[tuple[str, str]]:
    """(feature, estimator) of every fit `avkit fit` runs, for the features `present` in the traces: each
    present feature and the per-position-slope ablation of the written one, or only `fit.features`."""
    logistic = fit.estimator if fit.mode == "online" else "batch_logistic"
    if fit.features:
        absent = [n for n in fit.features if n not in present]
        if absent:
            raise ConfigError(f"--features {absent[0]}: is not in the traces (its columns are absent or "
                              f"hold nulls); the traces have {', '.join(n for n in FEATURES if n in present)}")
        return [(n, FEATURES[n].no_fit or logistic) for n in FEATURES if n in fit.features]
    plan = [(n, FEATURES[n].no_fit or logistic) for n in FEATURES if n in present]
    return plan + [(est_cfg.feature, "per_position_slope")]


def coefficients_doc(est, k: int, trained_on: dict, fit: FitConfig, est_cfg: EstimatorConfig) -> dict:
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
        "clock": trained_on["clock"],  # what counted engine steps: fit/data.py CLOCKS
        # the traces by content hash and the settings (avkit/provenance.py): `avkit report` checks them
        "trained_on": {**trained_on, "inputs": inputs_record(
            "avkit fit", trained_on["traces"], mode=fit.mode, feature=est_cfg.feature,
            refit_interval=est_cfg.refit_interval)},
    }



def reserve_fit_outputs(out_dir, outputs: StagedOutputs, name: str = "--out") -> dict[str, Path]:
    """Reserve the three outputs in `out_dir` (checked writable now); -> name -> temp path."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{name} {out}: exists and is not a directory")
    return {f: outputs.file(out / f, name) for f in FILES}


def write_fit_outputs(out_dir, result: FitResult, outputs: StagedOutputs | None = None) -> dict[str, Path]:
    """Write the three outputs into `out_dir` (created if needed); -> name -> final path.

    With `outputs` the files are only staged (the caller commits them with its other outputs);
    without, they are committed here.
    """
    if outputs is None:
        with StagedOutputs() as own:
            return write_fit_outputs(out_dir, result, own)
    tmp = reserve_fit_outputs(out_dir, outputs)
    tmp["coefficients.json"].write_text(json.dumps(json_safe(result.coefficients), indent=2, allow_nan=False) + "\n")
    tmp["scores.json"].write_text(json.dumps(json_safe(result.scores), indent=1, allow_nan=False) + "\n")
    result.trajectory.write_parquet(tmp["trajectory.parquet"], compression="zstd")
    return {name: Path(out_dir).expanduser() / name for name in FILES}



__all__ = ["FILES", "FitResult", "check_feature", "check_features", "coefficients_doc", "plan_features",
           "reserve_fit_outputs", "start_estimator", "write_fit_outputs"]
