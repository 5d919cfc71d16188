"""bench/estimators.py's online_multi and online_shift candidates: online_sameT's model on three lossless features
at once (online_shift: on its one feature), its intercepts optionally split into a shared shift and shrunk offsets.

    p_i = sigmoid(w . x + intercept_i),   x = T * (-log(-log q_max), -H(q), log q_max - log q_2nd)   [F = 3]
    intercept_i = b0_i + eps_i,  w . x + delta   with `offsets` set: delta a shared shift (the head's last weight,
                                                  on a column of ones), eps_i ~ N(0, 1 / offsets), b0 the warm start's

(T = 0 read as 1, as online_sameT's feature; `columns` keeps x's first F). Every feature is read from the draft
distribution before truncation, never from q(x_sampled): lossless. The refit is online_logistic's: one damped
Newton step per round of `refit_interval` engine steps from that round's IRLS sums alone, now with an H x H
head (H = F, + 1 for the shift) in the arrowhead Hessian [[A, B^T], [B, diag(c)]] (A = sum w x x^T [H, H],
B_i = sum_i w x [K, H], c_i = sum_i w), lam = offsets (0 without them), g_i = g1_i - lam eps_i:
  S    = A + (ridge + shrink) I - B^T diag(1 / (c + ridge + lam)) B               [H, H] Schur complement
  d_w  = S^{-1} (sum r x - shrink (w - w_start) - B^T (g / (c + ridge + lam))) * n / (n + damping)
  d_i  = (g_i - B_i . d_w) / (c_i + ridge + lam) * n_i / (n_i + damping)
(the shift's shrink is 0). -log(-log q_max) and the margin are nearly collinear (correlation 0.994 on both
shipped traces; the entropy 0.65-0.69 with either), so one round's F x F block is near-singular and its free
step is noise. `shrink` is a Gaussian prior centred on the warm start's weights (not a ridge toward 0, which
would pull the weights to a model nobody fitted): each round's weights are the round's evidence pooled with the
training traces' fit. Without `offsets` the intercepts are not shrunk (they track the traffic as online_sameT's
do); with them a level change is learned once, from every position's slots, by the shift, and a position's own
deviation only as far as its slots outweigh the prior. shrink = inf freezes the weights, offsets = inf the
offsets (the shift alone moves the intercepts). A singular or non-finite weight step is zeroed; a non-finite
intercept step leaves that intercept alone. The batch fit iterates the undamped step to its fixed point (the
ridge regularises only the step): with shrink 0 and no offsets the maximum-likelihood fit, the warm start.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from avkit.estimators.base import check_positions, sigmoid
from avkit.estimators.online_logistic import RoundLogistic
from avkit.features import FEATURES
from avkit.fit.replay import online_replay
from avkit.metrics import log_loss

NAMES = ("neg_log_neg_log_qmax", "entropy", "log_margin")  # trace features, each times T (entropy negated)
SIGNS = np.array([FEATURES[n].sign for n in NAMES])  # oriented: larger = more confident
assert all(FEATURES[n].lossless for n in NAMES)  # shapes of q only, never q(x_sampled)


def design(features: dict[str, np.ndarray], temperature: float) -> np.ndarray:
    """FitData features -> [N, F] x."""
    return (temperature or 1.0) * SIGNS * np.stack([features[n] for n in NAMES], axis=1)


class MultiLogistic(RoundLogistic):
    name = "multi_logistic"
    device_round = False

    def __init__(self, k: int = 7, config=None, shrink: float = 0.0, offsets: float | None = None,
                 columns: int = len(NAMES)):
        super().__init__(k, config)
        self.shrink, self.offsets, self.columns = shrink, offsets, columns  # columns: x's first F columns
        level = offsets is not None  # a shared shift, free: the head's last weight, on a column of ones
        self.weights = np.r_[self.config.init_slope, np.zeros(columns - 1 + level)]  # [F (+ 1)]
        self.start = self.weights.copy()  # [F (+ 1)] the prior's centre
        self.origin = self.intercepts.copy()  # [K] the offsets' zero: the warm start's intercepts
        self._sums = self._zero()

    @property
    def slope(self) -> float:  # the trajectory's "slope" column: the weight of -log(-log q_max)
        return float(self.weights[0])

    def _design(self, x) -> np.ndarray:
        """[n, >= F] features -> [n, H] the head's columns (a column of ones last for the shared shift)."""
        x = np.asarray(x, dtype=np.float64).reshape(-1, np.shape(x)[-1])[:, :self.columns]
        return x if self.offsets is None else np.c_[x, np.ones(len(x))]

    def _zero(self) -> dict[str, np.ndarray]:
        h, k = self.weights.size, self.k
        return {"a": np.zeros((h, h)), "b": np.zeros((k, h)), "c": np.zeros(k), "g0": np.zeros(h),
                "g1": np.zeros(k)}

    def coef(self):
        return {"weights": self.weights, "intercepts": self.intercepts}

    def _logits(self, coef, x, positions):
        return self._design(x) @ coef["weights"] + coef["intercepts"][positions]

    def accumulate(self, features, positions, predictions, labels) -> None:
        pos = check_positions(positions, self.k)
        x = self._design(features)  # [n, H]
        p = np.asarray(predictions, dtype=np.float64)
        w, r = p * (1.0 - p), np.asarray(labels, dtype=np.float64) - p  # [n]
        h, k, s = x.shape[1], self.k, self._sums
        wx = x * w[:, None]  # [n, H]
        s["a"] += wx.T @ x
        s["b"] += np.bincount((pos[:, None] * h + np.arange(h)).ravel(), weights=wx.ravel(),
                              minlength=k * h).reshape(k, h)
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
        lam = 0.0 if self.offsets is None else self.offsets  # the offsets' prior precision (inf: frozen)
        eps = self.intercepts - self.origin  # [K] each position's offset
        inv = np.zeros(self.k) if np.isinf(lam) else 1.0 / (s["c"] + ridge + lam)  # [K]
        g1 = s["g1"] - (0.0 if np.isinf(lam) else lam * eps)  # [K] the offsets' gradient, their prior's pull
        prior = np.full(self.weights.size, float(self.shrink))  # [H] the weights' prior precisions
        prior[self.columns:] = 0.0  # the shared shift is free
        free = np.isfinite(prior)  # shrink = inf freezes the features' weights
        d_w, applied = np.zeros(self.weights.size), True
        if free.any():
            schur = s["a"] + np.diag(ridge + np.where(free, prior, 0.0)) - s["b"].T @ (s["b"] * inv[:, None])
            rhs = s["g0"] - np.where(free, prior, 0.0) * (self.weights - self.start) - s["b"].T @ (g1 * inv)
            with np.errstate(all="ignore"):
                try:
                    d_w[free] = np.linalg.solve(schur[np.ix_(free, free)], rhs[free])
                except np.linalg.LinAlgError:
                    d_w[:] = np.nan
                d_w *= n.sum() / (n.sum() + damping) if damping > 0 else 1.0
            applied = bool(np.isfinite(d_w).all())
            d_w = d_w if applied else np.zeros(self.weights.size)
        with np.errstate(all="ignore"):
            d_i = (g1 - s["b"] @ d_w) * inv * (n / (n + damping) if damping > 0 else 1.0)  # [K]
        ok = (n > 0) & np.isfinite(d_i)
        self.weights = self.weights + d_w
        self.intercepts = np.where(ok, self.intercepts + np.where(ok, d_i, 0.0), self.intercepts)
        return applied

    def fit(self, x, positions, labels, max_iter: int = 50, tol: float = 1e-10) -> None:
        """Batch fit ([N, >= F] x, [N] positions, labels): the undamped step iterated to its fixed point, the
        maximum of the likelihood times the priors (shrink 0 and no offsets: the MLE, a warm start); the
        fitted weights and intercepts become the priors' centres."""
        pos = check_positions(positions, self.k)
        for _ in range(max_iter):
            self.reset_round()
            before = self.coefficients()
            self.accumulate(x, pos, sigmoid(self._logits(self.coef(), x, pos)), labels)
            self._step(None, 0.0)
            if np.max(np.abs(self.coefficients() - before)) < tol:
                break
        self.reset_round()
        self.observations = np.bincount(pos, minlength=self.k)
        self.start, self.origin = self.weights.copy(), self.intercepts.copy()

    def state_dict(self):
        return super().state_dict() | {"weights": self.weights[:self.columns].tolist()}

    def load_state_dict(self, state) -> None:
        """A warm start: its weights (the first F; the shared shift, if any, starts at 0) and intercepts
        become the priors' centres."""
        level = np.zeros(int(self.offsets is not None))
        self.weights = np.r_[np.asarray(state["weights"], dtype=np.float64)[:self.columns], level]
        self.start = self.weights.copy()
        super().load_state_dict(state)
        self.origin = self.intercepts.copy()


# The bench's protocol for these candidates: warm start, replay, a prior chosen by inner LOTO


def same_temperature(train: frozenset, temperature: float) -> frozenset:
    """The training traces at `temperature`, all of them where none is (online_sameT's and online_multi's start)."""
    return frozenset(t for t in train if t.temperature == temperature) or train


@cache
def multi_state(train: frozenset, columns: int = 3) -> dict:
    """online_multi's warm start (online_shift's: columns=1): the model on x's first `columns` features fitted to
    convergence on the training traces' slots."""
    ts = sorted(train, key=lambda t: t.name)
    est = MultiLogistic(columns=columns)
    est.fit(*(np.concatenate(x) for x in zip(*[(t.x, t.data.positions, t.data.labels) for t in ts])))
    return est.state_dict()


def multi_replay(trace, train: frozenset, shrink: float = 0.0, offsets: float | None = None,
                 columns: int = 3) -> np.ndarray:
    """[N] prequential predictions on `trace` (a bench/estimators.py Trace) from the training traces' warm start."""
    est = MultiLogistic(shrink=shrink, offsets=offsets, columns=columns)
    est.load_state_dict(multi_state(same_temperature(train, trace.temperature), columns))
    return online_replay(est, trace.data, trace.x)[0]


def choose(train: frozenset, option: str, grid: tuple, **fixed) -> float:
    """online_multi's shrink (online_shift's offsets) by LOTO inside `train`, each inner held-out trace started
    as the outer one is (from the other training traces at its temperature): the least mean log-loss."""
    ts = sorted(train, key=lambda t: t.name)
    score = {v: np.mean([log_loss(u.data.labels, multi_replay(u, train - {u}, **fixed, **{option: v}))
                         for u in ts]) for v in grid}
    return min(grid, key=score.get)


def sklearn_gap(x: np.ndarray, positions: np.ndarray, labels: np.ndarray, k: int = 7) -> float:
    """max |coefficient difference| between MultiLogistic.fit and scikit-learn's unpenalised LogisticRegression
    on the same design ([x, one-hot position], no shared intercept): the batch fit's independent oracle."""
    from sklearn.linear_model import LogisticRegression

    est = MultiLogistic(k)
    est.fit(x, positions, labels)
    ref = LogisticRegression(C=np.inf, fit_intercept=False, solver="newton-cholesky", tol=1e-12, max_iter=1000)
    ref.fit(np.c_[x, np.eye(k)[positions]], labels)
    return float(np.max(np.abs(ref.coef_[0] - est.coefficients())))


def penalised_gap(x: np.ndarray, positions: np.ndarray, labels: np.ndarray, k: int = 7, shrink: float = 100.0,
                  offsets: float = 10.0) -> float:
    """max |coefficient difference| between MultiLogistic.fit with a shared shift and both priors (centred 0.3
    off the maximum-likelihood fit, so that they pull) and scipy's L-BFGS-B on the same penalised negative
    log-likelihood: sum log(1 + e^-z) ... + shrink / 2 |w - w0|^2 + offsets / 2 |b - b0|^2 (the shift free)."""
    from scipy.optimize import minimize

    mle = MultiLogistic(k)
    mle.fit(x, positions, labels)
    est = MultiLogistic(k, shrink=shrink, offsets=offsets)
    est.load_state_dict(mle.state_dict() | {"weights": (mle.weights + 0.3).tolist(),
                                            "intercepts": (mle.intercepts - 0.3).tolist()})
    w0, b0, f = est.start[:-1].copy(), est.origin.copy(), x.shape[1]
    design = np.c_[x, np.ones(len(x)), np.eye(k)[positions]]  # [N, F + 1 + K]
    y = np.asarray(labels, dtype=np.float64)

    def loss(theta):
        z = design @ theta
        p = 1.0 / (1.0 + np.exp(-z))
        w, b = theta[:f] - w0, theta[f + 1:] - b0
        grad = design.T @ (p - y) + np.r_[shrink * w, 0.0, offsets * b]
        return np.logaddexp(0.0, z).sum() - y @ z + shrink / 2 * w @ w + offsets / 2 * b @ b, grad

    ref = minimize(loss, np.r_[w0, 0.0, b0], jac=True, method="L-BFGS-B", options={"gtol": 1e-10, "ftol": 1e-15, "maxiter": 5000})
    est.fit(x, positions, labels)
    return float(np.max(np.abs(ref.x - est.coefficients())))
