"""What `avkit fit` runs and what it returns, shared by every fit engine (in memory, out of core, Ray).

`plan_features` lists the (feature, estimator) fits for the features present in the traces,
`start_estimator` gives each fit its start state (a warm start from `--coefficients` for the
written one), and `coefficients_doc` writes the deployable estimator as coefficients.json. The
fits themselves import this module; it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from avkit.config import EstimatorConfig, FitConfig
from avkit.errors import ConfigError
from avkit.estimators import make_estimator
from avkit.estimators.coefficients import ServedPair, load_estimator
from avkit.features import FEATURES
from avkit.provenance import inputs_record

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


__all__ = ["FitResult", "check_feature", "check_features", "coefficients_doc", "plan_features",
           "start_estimator"]
