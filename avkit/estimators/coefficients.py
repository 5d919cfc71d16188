"""Coefficients files (`avkit fit`'s coefficients.json, `serve`'s snapshots) and estimators by name.

`load_estimator` builds an estimator from the registry by name and warm-starts it from a file: the
adaptive policy, `avkit fit`'s replay and the simulator build theirs here, so a name, an alias and a
file mean the same everywhere. Every reader of a file (serve's warm start and resume, simulate, the
report, `load_estimator`) goes through `load_coefficients`, the one validated loader, which either
returns a document whose fields are safe to use or raises one AvkitError line naming file and field:
  schema_version  1
  feature         a known, lossless feature that is fitted (not a no-fit probability)
  num_positions   integer K >= 1, equal to the K being served when one is given
  slope           finite, >= 0 (a larger feature means a more confident draft)
  intercepts      K finite numbers
  observations    optional: K integers >= 0
  rounds, rejected, shifts, refits   optional counters: integers >= 0
  estimator       optional: a registered estimator
  basis_slopes    optional (forgetting_logistic): 2 finite numbers, w1 >= 0 and w1 + w2 >= 0
  precision       optional (forgetting_logistic): finite a [2, 2], b [K, 2], c [K]
  platt           optional (forgetting_platt): the map's finite a, b and precision [2, 2]
  trained_on      optional object; its target / draft ids (and *_sha256) must match the pair being
                  served when both sides know them (sha256 wins over ids when both sides have it);
                  its `drafter` ("model" when absent, or "suffix": `avkit fit --drafter`) names the
                  rows it was fitted on and must match the rows it will score when the caller says
A file may nest the state under "state" (older snapshots); that object is validated instead.
Every writer (`avkit fit`, `avkit tune`'s profile, `serve`'s snapshots) builds its document with
`coefficients_document`, the one builder of this layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from avkit.config import DEFAULT_K, EstimatorConfig
from avkit.config.fit import FIT_DRAFTERS
from avkit.errors import AvkitError, ConfigError
from avkit.estimators.base import ESTIMATORS, Estimator, make_estimator
from avkit.features import FEATURES
from avkit.jsonsafe import read_json


@dataclass(frozen=True)
class ServedPair:
    """The model pair a coefficients file is deployed on ("" = unknown, not checked)."""

    target: str = ""
    draft: str = ""
    target_sha256: str = ""
    draft_sha256: str = ""


def _bad(source: str, field: str, why: str, value: Any) -> ConfigError:
    shown = repr(value)
    return ConfigError(f"coefficients {source}: field {field!r} {why}, got {shown[:80]}")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _int(x: Any, low: int = 0) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def _numbers(source: str, field: str, value: Any, shape: tuple[int, ...]) -> None:
    """Nested lists of finite numbers with exactly `shape`."""
    if not shape:
        if not _number(value):
            raise _bad(source, field, "must be a finite number", value)
        return
    if not isinstance(value, list) or len(value) != shape[0]:
        raise _bad(source, field, f"must be a list of {shape[0]}", value)
    for v in value:
        _numbers(source, field, v, shape[1:])


def _check_models(source: str, trained: dict, pair: ServedPair) -> None:
    for role in ("target", "draft"):  # by sha256 when both sides know it, else by id
        key = f"{role}_sha256" if trained.get(f"{role}_sha256") and getattr(pair, f"{role}_sha256") else role
        mine, served = trained.get(key, ""), getattr(pair, key)
        if mine and served and mine != served:
            raise _bad(source, f"trained_on.{key}", f"does not match the served {role} ({served})", mine)


def check_coefficients(doc: Any, source: str, *, k: int | None = None, pair: ServedPair | None = None,
                       drafter: str | None = None) -> dict:
    """Validate a parsed coefficients document (see the module docstring); -> the state to load."""
    if isinstance(doc, dict) and isinstance(doc.get("state"), dict):
        doc = doc["state"]
    if not isinstance(doc, dict):
        raise ConfigError(f"coefficients {source}: must be a JSON object, got {type(doc).__name__}")
    version = doc.get("schema_version", 1)
    if type(version) is not int or version != 1:
        raise _bad(source, "schema_version", "must be 1", doc.get("schema_version"))
    feature = doc.get("feature", "logit_qmax")
    spec = FEATURES.get(feature) if isinstance(feature, str) else None
    if spec is None or not spec.lossless or spec.no_fit is not None:
        raise _bad(source, "feature", "must be a known lossless feature to fit "
                   f"({', '.join(n for n, s in FEATURES.items() if s.lossless and s.no_fit is None)})", feature)
    n = doc.get("num_positions")
    if not _int(n, 1):
        raise _bad(source, "num_positions", "must be an integer >= 1", n)
    if k is not None and n != k:
        raise _bad(source, "num_positions", f"does not match the K being served ({k})", n)
    if not _number(doc.get("slope")) or doc["slope"] < 0:
        raise _bad(source, "slope", "must be a finite number >= 0", doc.get("slope"))
    _numbers(source, "intercepts", doc.get("intercepts"), (n,))
    obs = doc.get("observations")
    if obs is not None and not (isinstance(obs, list) and len(obs) == n and all(map(_int, obs))):
        raise _bad(source, "observations", f"must be {n} integers >= 0", obs)
    for key in ("rounds", "rejected", "shifts", "refits"):
        if not _int(doc.get(key, 0)):
            raise _bad(source, key, "must be an integer >= 0", doc.get(key))
    name = doc.get("estimator", doc.get("name"))
    if name is not None and (not isinstance(name, str) or name not in ESTIMATORS):
        raise _bad(source, "estimator", f"must be one of {sorted(ESTIMATORS)}", name)
    if "basis_slopes" in doc:
        w = doc["basis_slopes"]
        _numbers(source, "basis_slopes", w, (2,))
        if w[0] < 0 or w[0] + w[1] < 0:
            raise _bad(source, "basis_slopes", "must keep p monotone (w1 >= 0, w1 + w2 >= 0)", w)
    if "precision" in doc:
        prec = doc["precision"]
        if not isinstance(prec, dict):
            raise _bad(source, "precision", "must be an object {a, b, c}", prec)
        for part, shape in (("a", (2, 2)), ("b", (n, 2)), ("c", (n,))):
            _numbers(source, f"precision.{part}", prec.get(part), shape)
    if "platt" in doc:
        m = doc["platt"]
        if not isinstance(m, dict):
            raise _bad(source, "platt", "must be an object {a, b, precision}", m)
        for part, shape in (("a", ()), ("b", ()), ("precision", (2, 2))):
            _numbers(source, f"platt.{part}", m.get(part), shape)
    trained = doc.get("trained_on", {})
    if not isinstance(trained, dict):
        raise _bad(source, "trained_on", "must be an object", trained)
    for key in ("target", "draft", "target_sha256", "draft_sha256"):
        if not isinstance(trained.get(key, ""), str):
            raise _bad(source, f"trained_on.{key}", "must be a string", trained.get(key))
    if pair is not None:
        _check_models(source, trained, pair)
    fitted_on = trained.get("drafter", "model")
    if fitted_on not in FIT_DRAFTERS:
        raise _bad(source, "trained_on.drafter", f"must be one of {list(FIT_DRAFTERS)}", fitted_on)
    if drafter is not None and fitted_on != drafter:
        raise _bad(source, "trained_on.drafter", f"must be {drafter!r}: it scores {drafter!r} rows (fit it with "
                   f"`avkit fit --drafter {drafter}`)", fitted_on)
    return doc


def load_coefficients(path, *, k: int | None = None, pair: ServedPair | None = None,
                      drafter: str | None = None) -> dict:
    """Read and validate a coefficients file; raise ConfigError (one line: file, field, value)."""
    path = Path(path).expanduser()
    return check_coefficients(read_json(path, "coefficients"), str(path), k=k, pair=pair, drafter=drafter)


DEFAULT_FEATURE = "logit_qmax"


def coefficients_document(est: Estimator, trained_on: dict, *, mode: str | None = None, sign: bool = False,
                          settings: dict | None = None, with_state: bool = True) -> dict | None:
    """An estimator's coefficients document (the layout above); None when it has no slope and intercepts.

    With `with_state`, every key of its `state_dict()` comes first, so `load_state_dict` restores it
    exactly (round counter, forgetting_logistic's basis slopes and precision); then schema_version,
    feature, feature_sign (with `sign`: p = sigmoid(slope * sign * feature + b_j), the sign applied
    inside the estimator), num_positions, slope, intercepts, observations, `mode`, estimator, the
    writer's `settings` and `trained_on`.
    """
    state = dict(est.state_dict())
    if "slope" not in state or "intercepts" not in state:
        return None
    feature = state.get("feature", DEFAULT_FEATURE)
    intercepts = [float(b) for b in state["intercepts"]]
    doc = {"schema_version": 1, "feature": feature, **({"feature_sign": FEATURES[feature].sign} if sign else {}),
           "num_positions": len(intercepts), "slope": float(state["slope"]), "intercepts": intercepts,
           "observations": [int(n) for n in state.get("observations", [0] * len(intercepts))],
           **({"mode": mode} if mode else {}), "estimator": state.get("name", getattr(est, "name", "online_logistic")),
           **(settings or {}), "trained_on": trained_on}
    return {**state, **doc} if with_state else doc
OWN_FILES = ("forgetting_logistic", "forgetting_platt", "per_position_slope")  # files only their own estimator can load
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
    """An estimator from the registry (K positions), warm-started from a coefficients file if given
    (`load_coefficients`, then `load_state_dict`); "none" -> None (full verification). A file of an
    OWN_FILES estimator loads only into that estimator; `drafter`: the rows it will score."""
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
