"""The acceptance-estimator protocol and registry.

An estimator maps a lossless feature of each draft slot and its position to a predicted
acceptance probability, and (optionally) learns from verification outcomes.
Glossary:
  feature     one scalar per draft slot, e.g. logit(q_max)  [N]
  position    draft position i in [0, K)                     [N]
  observed    slot carries a label (verified and at or before the first rejection)
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from avkit.errors import DataError
from avkit.registry import Registry


def check_positions(positions, k: int) -> np.ndarray:
    """[N] draft positions, checked in [0, K) -> intp."""
    pos = np.asarray(positions)
    if pos.size and (pos.min() < 0 or pos.max() >= k):
        bad = pos.min() if pos.min() < 0 else pos.max()
        raise DataError(f"positions must be in [0, {k}), got {bad}")
    return pos.astype(np.intp, copy=False)


class Estimator(Protocol):
    name: str
    lossless: bool  # False only for estimators fed a lossy feature (e.g. q_sampled)

    def predict(self, features: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """[N] float, [N] int -> [N] probabilities in [0, 1]."""
        ...

    def update(self, features: np.ndarray, positions: np.ndarray, predictions: np.ndarray,
               labels: np.ndarray, steps: int = 1) -> bool:
        """Feed the observed slots of `steps` engine steps ([N] each; labels in {0,1}, only observed
        rows); live feeds one step per call. `predictions` are the estimator's own predictions made
        when drafting. Returns True when this call completed a refit round. An estimator that refits
        in rounds also has `steps_to_refit` (steps a call may feed at most) and `reset_round()`
        (drop an unfinished round); estimators/rounds.py drives replays through them."""
        ...

    def state_dict(self) -> dict[str, Any]:
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (same K)."""
        ...


# name -> factory(k=..., ...) -> Estimator; each module is imported the first time its name is looked up.
ESTIMATORS = Registry("estimator", {
    "online_logistic": "avkit.estimators.online_logistic:OnlineLogistic",
    "batch_logistic": "avkit.estimators.online_logistic:BatchLogistic",
    "forgetting_logistic": "avkit.estimators.forgetting_logistic:ForgettingLogistic",
    "per_position_slope": "avkit.estimators.online_logistic:PerPositionSlope",
    "passthrough": "avkit.estimators.passthrough:Passthrough",
    "qmax": "avkit.estimators.passthrough:QMax",
})
register = ESTIMATORS.register  # plug-ins: @register("name") on a factory


def make_estimator(name: str, **kwargs) -> Estimator:
    return ESTIMATORS.make(name, **kwargs)
