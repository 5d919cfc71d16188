"""Ablation: a slope per position, p_i = sigmoid(slope_i * f + intercept_i): 2K parameters.

Same rounds, statistics, ridge, damping and guards as `online_logistic`; the Newton step is an
independent 2x2 solve per position (estimators/irls.py `per_position_step`). It asks whether
the shared slope of the shipped estimator costs accuracy.
"""

from __future__ import annotations

import numpy as np

from avkit.config import DEFAULT_K, EstimatorConfig
from avkit.estimators.irls import per_position_step
from avkit.estimators.online_logistic import RoundLogistic


class PerPositionSlope(RoundLogistic):
    """Examples
    --------
    >>> est = PerPositionSlope(k=2)
    >>> est.slopes.tolist()
    [0.5, 0.5]
    """

    name = "per_position_slope"

    def __init__(self, k: int = DEFAULT_K, config: EstimatorConfig | None = None):
        super().__init__(k, config)
        self.slopes = np.full(k, self.config.init_slope)  # [K]

    def _logits(self, features, positions):
        return self.slopes[positions] * features + self.intercepts[positions]

    def _coefficient_arrays(self):
        return {"slopes": self.slopes, "intercepts": self.intercepts}

    def _logits_torch(self, coef, features, positions):
        return coef["slopes"][positions] * features + coef["intercepts"][positions]

    def _slope_at(self, position):
        return self.slopes[position]

    def _step(self, stats, damping):
        self.slopes, self.intercepts, ok = per_position_step(
            stats, self.slopes, self.intercepts, self.config.ridge, damping)
        return bool(ok.any())

    def coefficients(self):
        return np.r_[self.slopes, self.intercepts]

    def state_dict(self):
        return super().state_dict() | {"slopes": self.slopes.tolist()}

    def load_state_dict(self, state):
        self.slopes = np.asarray(state["slopes"], dtype=np.float64)
        super().load_state_dict(state)


__all__ = ["PerPositionSlope"]
