"""An online Platt map, and `forgetting_platt`: forgetting_logistic's logit through it.

    p' = sigmoid(a z + b)          z: a base prediction's logit

The map starts at the identity (a, b) = (1, 0), its prior's centre, and is refit after every round
of `every` engine steps from that round's (z, label) pairs of the traffic being served, each slot predicted before
its label is learned from. It tracks the maximum a posteriori fit on every earlier round under a Gaussian prior
of precision `prior` at the centre: after each round, the exact MAP fit of that round's slots under the Laplace
approximation of everything before (precision P: prior I plus every earlier round's curvature; Newton steps,
halved until the objective falls), then P <- P + sum q (1 - q) x x^T at the new fit (x = (z, 1),
q = sigmoid(a z + b)): O(round) per round (an assumed-density filter; the exact MAP fit on the same slots is its
counterpart in the tests). A single Newton step is not enough: on confident logits (z ~ 7-14 at T = 0.3) a
round's few misses carry a large gradient at almost no curvature, and one step from a weak prior overshoots
(a from 1 to 0.19 on the first round of a T = 0.3 trace at prior 10).
prior = inf keeps the identity. It reads the base prediction and past labels only: lossless where the base is.

bench/recalibration.py applies the same map to a blend of two candidates' predictions (`online_platt`);
`forgetting_platt` is the deployable form (serve, adaptive policies, `avkit fit --estimator`).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from avkit.config import DEFAULT_K, EstimatorConfig, ForgettingConfig, PlattConfig
from avkit.estimators.base import check_positions, sigmoid
from avkit.estimators.forgetting_logistic import ForgettingLogistic

EPS = 1e-6  # probabilities are clipped to [EPS, 1 - EPS] before their logit


def logit(p: np.ndarray) -> np.ndarray:
    """[N] probabilities -> [N] log-odds (clipped away from 0 and 1)."""
    p = np.clip(np.asarray(p, dtype=np.float64), EPS, 1.0 - EPS)
    return np.log(p) - np.log1p(-p)


def blend(p_a: np.ndarray, p_b: np.ndarray, w: float) -> np.ndarray:
    """[N] the logit-linear pool sigmoid(w logit(p_a) + (1 - w) logit(p_b)) of two predictions."""
    return sigmoid(w * logit(p_a) + (1.0 - w) * logit(p_b))


class PlattMap:
    """The map's coefficients (a, b), its Laplace precision, and the open round's sums.

    >>> m = PlattMap(prior=1.0)
    >>> m.add(np.zeros(4), np.ones(4)); m.step(); bool(m.theta[1] > 0)
    True
    """

    def __init__(self, prior: float):
        self.prior = float(prior)
        self.theta = np.array([1.0, 0.0])  # [2] (a, b), starting at the prior's centre (the identity)
        self.precision = (self.prior + 1e-9) * np.eye(2) if np.isfinite(self.prior) else np.eye(2)  # [2, 2]
        self._z, self._y = [], []  # the open round's base logits and labels

    def __call__(self, z):
        """[...] base logits (numpy or torch) -> [...] recalibrated logits."""
        return self.theta[0] * z + self.theta[1]

    def add(self, z: np.ndarray, labels: np.ndarray) -> None:
        """Keep a round's slots ([N] base logits, [N] labels in {0, 1}) until the round closes."""
        if np.isfinite(self.prior):
            self._z.append(np.asarray(z, dtype=np.float64))
            self._y.append(np.asarray(labels, dtype=np.float64))

    def step(self, iters: int = 20, tol: float = 1e-9) -> None:
        """Close the round: its MAP fit under the Laplace prior (theta, precision), then fold in its curvature."""
        if not np.isfinite(self.prior) or not self._z:
            self._z, self._y = [], []
            return
        x = np.c_[np.concatenate(self._z), np.ones(sum(map(len, self._z)))]  # [N, 2]
        y, centre, theta = np.concatenate(self._y), self.theta, self.theta.copy()

        def objective(t):  # negative log-posterior of the round, up to a constant
            s, d = x @ t, t - centre
            return np.logaddexp(0.0, s).sum() - y @ s + 0.5 * d @ self.precision @ d

        for _ in range(iters):
            q = sigmoid(x @ theta)  # [N]
            grad = x.T @ (y - q) - self.precision @ (theta - centre)  # [2] ascent direction of the log-posterior
            step = np.linalg.solve(self.precision + (x * (q * (1.0 - q))[:, None]).T @ x, grad)
            now = objective(theta)
            while objective(theta + step) > now and np.max(np.abs(step)) > tol:
                step = step / 2
            theta = theta + step
            if np.max(np.abs(step)) < tol:
                break
        q = sigmoid(x @ theta)
        self.theta, self.precision = theta, self.precision + (x * (q * (1.0 - q))[:, None]).T @ x
        self._z, self._y = [], []

    def state_dict(self) -> dict[str, Any]:
        return {"a": float(self.theta[0]), "b": float(self.theta[1]), "precision": self.precision.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.theta = np.array([state["a"], state["b"]], dtype=np.float64)
        self.precision = np.asarray(state["precision"], dtype=np.float64).reshape(2, 2)


def online_platt(p: np.ndarray, labels: np.ndarray, row_step: np.ndarray, prior: float,
                 every: int = 10) -> np.ndarray:
    """[N] p recalibrated online: the slots of round r (engine steps [r every, (r + 1) every); [N] row_step
    non-decreasing) through the map learned from rounds < r."""
    z, y = logit(p), np.asarray(labels, dtype=np.float64)
    rounds = np.asarray(row_step) // every  # [N]
    edges = np.r_[0, np.flatnonzero(np.diff(rounds)) + 1, z.size]
    out, platt = np.empty_like(z), PlattMap(prior)
    for lo, hi in itertools.pairwise(edges):
        out[lo:hi] = sigmoid(platt(z[lo:hi]))
        platt.add(z[lo:hi], y[lo:hi])
        platt.step()
    return out


class ForgettingPlatt(ForgettingLogistic):
    """forgetting_logistic's model and refits (on its own predictions), its logit through an online Platt map
    refit every `platt.every` engine steps. Its state (coefficients file, serve snapshot) is forgetting_logistic's
    plus the map's under "platt"; a file without one (forgetting_logistic's, online_logistic's) warm-starts the
    base with the identity map.

    >>> est = ForgettingPlatt(k=2)
    >>> est.predict(np.array([0.0]), np.array([0])).round(4).tolist()
    [0.4502]
    """

    name = "forgetting_platt"

    def __init__(self, k: int = DEFAULT_K, config: EstimatorConfig | None = None,
                 forgetting: ForgettingConfig | None = None, platt: PlattConfig | None = None):
        super().__init__(k, config, forgetting)
        self.platt = platt or PlattConfig()
        self.map = PlattMap(self.platt.prior)
        self._platt_steps = 0  # engine steps in the map's open round

    def coef(self):
        return super().coef() | {"platt": self.map.theta}

    def _base_logits(self, coef, features, positions):
        return super()._logits(coef, features, positions)

    def _logits(self, coef, features, positions):
        return coef["platt"][0] * self._base_logits(coef, features, positions) + coef["platt"][1]

    @property
    def steps_to_refit(self) -> int:
        """The fewer steps of the base's round and the map's: a replay never feeds a call across either."""
        return min(super().steps_to_refit, self.platt.every - self._platt_steps)

    def accumulate(self, features, positions, predictions, labels) -> None:
        """The base's round from its own predictions (the map's input), the map's round from its logits."""
        pos = check_positions(positions, self.k)
        z = self._base_logits(self.coef(), self.oriented(features), pos)  # [N] unchanged since predicted
        super().accumulate(features, pos, sigmoid(z), labels)
        self.map.add(z, labels)

    def update(self, features, positions, predictions, labels, steps: int = 1) -> bool:
        self._check_steps(steps)
        self.accumulate(features, positions, predictions, labels)
        self._platt_steps += steps
        mapped = self._platt_steps >= self.platt.every
        if mapped:
            self.map.step()
            self._platt_steps = 0
            self._moved()
        return self._advance(steps) or mapped

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"platt": self.map.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.map = PlattMap(self.platt.prior)
        if "platt" in state:
            self.map.load_state_dict(state["platt"])
        self._platt_steps = 0
        self._moved()
