"""bench/estimators.py's online_multi candidate: online_sameT's model on three lossless features at once.

    p_i = sigmoid(w . x + intercept_i),   x = T * (-log(-log q_max), -H(q), log q_max - log q_2nd)   [F = 3]

(T = 0 read as 1, as online_sameT's feature). Every feature is read from the draft distribution before
truncation, never from q(x_sampled): lossless. The refit is online_logistic's: one damped Newton step per
round of `refit_interval` engine steps from that round's IRLS sums alone, now with an F x F head in the
arrowhead Hessian [[A, B^T], [B, diag(c)]] (A = sum w x x^T [F, F], B_i = sum_i w x [K, F], c_i = sum_i w):
  S    = A + (ridge + shrink) I - B^T diag(1 / (c + ridge)) B                        [F, F] Schur complement
  d_w  = S^{-1} (sum r x - shrink (w - w_start) - B^T (g1 / (c + ridge))) * n / (n + damping)
  d_i  = (g1_i - B_i . d_w) / (c_i + ridge) * n_i / (n_i + damping)
-log(-log q_max) and the margin are nearly collinear (correlation 0.994 on both shipped traces; the entropy
0.65-0.69 with either), so one round's F x F block is near-singular and its free step is noise. `shrink` is a Gaussian prior centred on the warm
start's weights (not a ridge toward 0, which would pull the weights to a model nobody fitted): each round's
weights are the round's evidence pooled with the training traces' fit; the intercepts are not shrunk (they
track the traffic as online_sameT's do). shrink = inf freezes the weights. A singular or non-finite weight
step is zeroed; a non-finite intercept step leaves that intercept alone. The batch fit (the warm start)
iterates the undamped step with shrink 0 to the maximum-likelihood fit (the ridge regularises only the step).
"""

from __future__ import annotations

import numpy as np

from avkit.estimators.base import check_positions, sigmoid
from avkit.estimators.online_logistic import RoundLogistic
from avkit.features import FEATURES

NAMES = ("neg_log_neg_log_qmax", "entropy", "log_margin")  # trace features, each times T (entropy negated)
SIGNS = np.array([FEATURES[n].sign for n in NAMES])  # oriented: larger = more confident
assert all(FEATURES[n].lossless for n in NAMES)  # shapes of q only, never q(x_sampled)


def design(features: dict[str, np.ndarray], temperature: float) -> np.ndarray:
    """FitData features -> [N, F] x."""
    return (temperature or 1.0) * SIGNS * np.stack([features[n] for n in NAMES], axis=1)


class MultiLogistic(RoundLogistic):
    name = "multi_logistic"
    device_round = False

    def __init__(self, k: int = 7, config=None, shrink: float = 0.0):
        super().__init__(k, config)
        self.shrink = shrink
        self.weights = np.r_[self.config.init_slope, np.zeros(len(NAMES) - 1)]  # [F]
        self.start = self.weights.copy()  # [F] the prior's centre
        self._sums = self._zero()

    @property
    def slope(self) -> float:  # the trajectory's "slope" column: the weight of -log(-log q_max)
        return float(self.weights[0])

    def _zero(self) -> dict[str, np.ndarray]:
        f, k = len(NAMES), self.k
        return {"a": np.zeros((f, f)), "b": np.zeros((k, f)), "c": np.zeros(k), "g0": np.zeros(f),
                "g1": np.zeros(k)}

    def coef(self):
        return {"weights": self.weights, "intercepts": self.intercepts}

    def _logits(self, coef, x, positions):
        return x @ coef["weights"] + coef["intercepts"][positions]

    def accumulate(self, features, positions, predictions, labels) -> None:
        pos = check_positions(positions, self.k)
        x = np.asarray(features, dtype=np.float64).reshape(pos.size, len(NAMES))  # [n, F]
        p = np.asarray(predictions, dtype=np.float64)
        w, r = p * (1.0 - p), np.asarray(labels, dtype=np.float64) - p  # [n]
        f, k, s = len(NAMES), self.k, self._sums
        wx = x * w[:, None]  # [n, F]
        s["a"] += wx.T @ x
        s["b"] += np.bincount((pos[:, None] * f + np.arange(f)).ravel(), weights=wx.ravel(),
                              minlength=k * f).reshape(k, f)
        s["c"] += np.bincount(pos, weights=w, minlength=k)
        s["g0"] += x.T @ r
        s["g1"] += np.bincount(pos, weights=r, minlength=k)
        self._round.n += np.bincount(pos, minlength=k)  # RoundLogistic.refit counts the round's slots

    def reset_round(self) -> None:
        super().reset_round()
        self._sums = self._zero()

    def _step(self, stats, damping) -> bool:
        s, n, ridge = self._sums, self._round.n.astype(np.float64), self.config.ridge
        if not n.any():
            return False
        inv = 1.0 / (s["c"] + ridge)  # [K]
        d_w, applied = np.zeros(len(NAMES)), True
        if np.isfinite(self.shrink):
            schur = s["a"] + (ridge + self.shrink) * np.eye(len(NAMES)) - s["b"].T @ (s["b"] * inv[:, None])
            rhs = s["g0"] - self.shrink * (self.weights - self.start) - s["b"].T @ (s["g1"] * inv)
            with np.errstate(all="ignore"):
                try:
                    d_w = np.linalg.solve(schur, rhs) * (n.sum() / (n.sum() + damping) if damping > 0 else 1.0)
                except np.linalg.LinAlgError:
                    d_w[:] = np.nan
            applied = bool(np.isfinite(d_w).all())
            d_w = d_w if applied else np.zeros(len(NAMES))
        with np.errstate(all="ignore"):
            d_i = (s["g1"] - s["b"] @ d_w) * inv * (n / (n + damping) if damping > 0 else 1.0)  # [K]
        ok = (n > 0) & np.isfinite(d_i)
        self.weights = self.weights + d_w
        self.intercepts = np.where(ok, self.intercepts + np.where(ok, d_i, 0.0), self.intercepts)
        return applied

    def fit(self, x, positions, labels, max_iter: int = 50, tol: float = 1e-10) -> None:
        """Batch maximum-likelihood fit ([N, F] x, [N] positions, labels); the weights become the prior's centre."""
        pos, shrink, self.shrink = check_positions(positions, self.k), self.shrink, 0.0
        for _ in range(max_iter):
            self.reset_round()
            before = self.coefficients()
            self.accumulate(x, pos, sigmoid(self._logits(self.coef(), x, pos)), labels)
            self._step(None, 0.0)
            if np.max(np.abs(self.coefficients() - before)) < tol:
                break
        self.reset_round()
        self.observations, self.shrink, self.start = np.bincount(pos, minlength=self.k), shrink, self.weights.copy()

    def state_dict(self):
        return super().state_dict() | {"weights": self.weights.tolist()}

    def load_state_dict(self, state) -> None:
        self.weights = np.asarray(state["weights"], dtype=np.float64)
        self.start = self.weights.copy()
        super().load_state_dict(state)


def sklearn_gap(x: np.ndarray, positions: np.ndarray, labels: np.ndarray, k: int = 7) -> float:
    """max |coefficient difference| between MultiLogistic.fit and scikit-learn's unpenalised LogisticRegression
    on the same design ([x, one-hot position], no shared intercept): the batch fit's independent oracle."""
    from sklearn.linear_model import LogisticRegression

    est = MultiLogistic(k)
    est.fit(x, positions, labels)
    ref = LogisticRegression(C=np.inf, fit_intercept=False, solver="newton-cholesky", tol=1e-12, max_iter=1000)
    ref.fit(np.c_[x, np.eye(k)[positions]], labels)
    return float(np.max(np.abs(ref.coef_[0] - est.coefficients())))
