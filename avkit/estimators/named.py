"""An acceptance estimator by name, warm-started from a coefficients file, and the feature it reads.

The adaptive policy (scheduling/adaptive.py), `avkit fit`'s replay and the simulator build their
estimators here, so a name, an alias and a file mean the same everywhere.
"""

from __future__ import annotations

from pathlib import Path

from avkit.config import DEFAULT_K, EstimatorConfig
from avkit.errors import AvkitError, ConfigError
from avkit.estimators.base import ESTIMATORS, Estimator, make_estimator
from avkit.estimators.coefficients import ServedPair, load_coefficients

DEFAULT_FEATURE = "logit_qmax"
OWN_FILES = ("forgetting_logistic", "per_position_slope")  # files only their own estimator can load
# Estimators that use a probability-valued feature as is, and the feature they read.
PROBABILITY_FEATURES = {"qmax": "q_max", "passthrough": "head_conf"}
ALIASES = {"online": "online_logistic", "batch": "batch_logistic"}


def estimator_feature(estimator: Estimator) -> str:
    """The DraftBatch feature an estimator reads: its `feature`, its config's, or its no-fit input."""
    if hasattr(estimator, "feature"):
        return str(estimator.feature)
    if hasattr(getattr(estimator, "config", None), "feature"):
        return str(estimator.config.feature)
    return PROBABILITY_FEATURES.get(getattr(estimator, "name", ""), DEFAULT_FEATURE)


def load_estimator(name: str, coefficients: str | Path = "", k: int = DEFAULT_K, pair: ServedPair | None = None,
                   drafter: str | None = None, **kwargs) -> Estimator | None:
    """An estimator from the registry (K positions), warm-started from a coefficients file if given.

    "none" -> None (full verification); "online" is short for "online_logistic". The file goes through
    the one validated loader (estimators/coefficients.py: K, finiteness, feature, the served `pair`)
    and then the estimator's `load_state_dict`. A file written by `forgetting_logistic` (two basis
    slopes) or `per_position_slope` loads only into that estimator; a shared-slope file into any.
    `drafter` ("model" or "suffix"): the rows the estimator will score, when a file is given; the file
    must have been fitted on that drafter's rows (its `trained_on.drafter`, "model" when absent).
    """
    name = ALIASES.get(name, name)
    if name == "none":
        return None
    if name not in ESTIMATORS:
        raise ConfigError(f"unknown estimator {name}; choose from {', '.join(sorted([*ESTIMATORS, *ALIASES, 'none']))}")
    if not coefficients:
        return make_estimator(name, k=k, **kwargs)
    path = Path(coefficients).expanduser()
    if not path.is_file():
        raise ConfigError(f"--coefficients: no such file: {path}")
    state = load_coefficients(path, k=k, pair=pair, drafter=drafter)
    written_by = state.get("estimator", state.get("name", "online_logistic"))
    if written_by in OWN_FILES and written_by != name:
        raise ConfigError(f"coefficients {path}: field 'estimator' is {written_by!r}; its coefficients load "
                          f"only into {written_by!r}, not {name!r}")
    feature = state.get("feature")
    if feature and "config" not in kwargs and feature != EstimatorConfig().feature:
        kwargs["config"] = EstimatorConfig(feature=feature)  # the fitted file names its feature
    estimator = make_estimator(name, k=k, **kwargs)
    if feature and estimator_feature(estimator) != feature:
        raise ConfigError(f"coefficients {path}: field 'feature' is {feature!r}, estimator {name!r} reads "
                          f"{estimator_feature(estimator)!r}")
    try:
        estimator.load_state_dict(state)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError, AvkitError) as e:
        raise ConfigError(f"coefficients {path}: cannot warm-start {name!r} from it ({e})") from None
    return estimator


__all__ = ["ALIASES", "DEFAULT_FEATURE", "OWN_FILES", "PROBABILITY_FEATURES", "estimator_feature", "load_estimator"]
