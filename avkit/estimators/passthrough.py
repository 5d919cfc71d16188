"""Estimators with no fit: a feature that already is a probability is used as the prediction.

  passthrough  a trained confidence head's output (`head_conf` trace column)
  qmax         q_max itself (the seeds' "q_max (no fit)" row, docs/seeds.md: fair ranking, poor calibration)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from avkit.config import DEFAULT_K
from avkit.errors import DataError
from avkit.estimators.base import check_positions


class Passthrough:
    """Examples
    --------
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


__all__ = ["Passthrough", "QMax"]
