"""The acceptance-estimator protocol and registry, and the estimators with no fit: an estimator maps a
lossless feature of each draft slot ([N], e.g. logit(q_max)) and its position ([N] in [0, K)) to a predicted
acceptance probability, and may learn from the observed slots' outcomes.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from avkit.errors import DataError
from avkit.config import DEFAULT_K
from avkit.registry import Registry


def check_positions(positions, k: int) -> np.ndarray:
    """[N] draft positions, checked in [0, K) -> intp."""
    pos = np.asarray(positions)
    if pos.size and (pos.min() < 0 or pos.max() >= k):
        bad = pos.min() if pos.min() < 0 else pos.max()
        raise DataError(f"positions must be in [0, {k}), got {bad}")
    return pos.astype(np.intp, copy=False)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic 1 / (1 + exp(-x)) as 0.5 (1 + tanh(x / 2)): no overflow at any x (exactly 0 from x ≈ -38)."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


class Estimator(Protocol):
    name: str
    lossless: bool  # False only for estimators fed a lossy feature (e.g. q_sampled)

    def predict(self, features: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """[N] float, [N] int -> [N] probabilities in [0, 1]."""
        ...

    def update(self, features: np.ndarray, positions: np.ndarray, predictions: np.ndarray,
               labels: np.ndarray, steps: int = 1) -> bool:
        """Feed the observed slots ([N] each, labels in {0, 1}, `predictions` its own made when drafting) of
        `steps` engine steps; True when a refit round completed. One that refits in rounds also has
        `steps_to_refit` and `reset_round()` (estimators/rounds.py drives replays through them)."""
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
    "forgetting_platt": "avkit.estimators.platt:ForgettingPlatt",
    "per_position_slope": "avkit.estimators.online_logistic:PerPositionSlope",
    "passthrough": "avkit.estimators.base:Passthrough",
    "qmax": "avkit.estimators.base:QMax",
})
register = ESTIMATORS.register  # plug-ins: @register("name") on a factory


def make_estimator(name: str, **kwargs) -> Estimator:
    return ESTIMATORS.make(name, **kwargs)


class Passthrough:
    """No fit: a feature that already is a probability is the prediction (a trained confidence head's
    `head_conf`; `QMax`: q_max itself, docs/seeds.md: fair ranking, poor calibration).

    >>> Passthrough(k=2).predict(np.array([0.25, 0.9]), np.array([0, 1])).tolist()
    [0.25, 0.9]
    """

    name = "passthrough"
    lossless = True

    def __init__(self, k: int = DEFAULT_K, **_ignored):
        self.k = k

    def predict(self, features: np.ndarray, positions: np.ndarray) -> np.ndarray:
        check_positions(positions, self.k)
        p = np.asarray(features, dtype=np.float64)
        if p.size and not (np.nanmin(p) >= 0 and np.nanmax(p) <= 1):
            raise DataError(f"{self.name}: features must be probabilities in [0, 1], got "
                            f"{p.min() if p.min() < 0 else p.max()}")
        return p

    def predict_torch(self, features, positions):
        """`predict` on the device: the feature itself (the engine's features are probabilities)."""
        return features.double()

    def update(self, features, positions, predictions, labels, steps: int = 1) -> bool:
        return False  # nothing to learn

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "num_positions": self.k}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class QMax(Passthrough):
    """q_max used directly as the acceptance probability."""

    name = "qmax"
