"""A second online estimator: refit from exponentially forgotten curvature, on a two-term basis.

It reads the same single lossless feature as `online_logistic` (logit(q_max) by default) and
keeps O(K) state, so it deploys wherever that one does. Two things differ.

The basis. vLLM's model p_i = sigmoid(slope * f + intercept_i) is misspecified on the shipped
sampled trace: even its in-sample maximum-likelihood fit has ECE 0.012. Here
    p_i = sigmoid(w1 * f + w2 * h(f) + intercept_i),   h(f) = -log(softplus(-f)) = -log(-log q_max)
(h is a function of the same feature, hence lossless; h(f) ~ f for confident drafts and bends
below them). Monotone in f iff w1 >= 0 and w1 + w2 >= 0 (h' is in (0, 1]), which the guard keeps.
The Hessian stays arrowhead with a 2x2 head: [[A (2x2), B^T], [B (K x 2), diag(C)]].

The refit. vLLM's estimator takes one damped Newton step from each round's statistics alone; that
lands near the round's own maximum-likelihood fit, so its coefficients are essentially the fit of
the last 100 engine steps: noisy, and slow to start. Here the past log-likelihood is kept as a
quadratic around the current coefficients (a Laplace approximation with the same arrowhead
precision, O(K)) and forgotten exponentially:
  P   <- keep * P + H_round            keep = 0.5 ** (steps in round / half_life)
  step = (P + ridge I)^{-1} g_round    (Schur complement of diag(C): a 2x2 solve, then K divisions)
with H_round, g_round the round's IRLS sums at the predictions made when drafting (= the current
coefficients, where the forgotten quadratic has zero gradient). No damping: the past is the prior.
Guard as vLLM: a slope step that is NaN or breaks monotonicity is zeroed and the intercepts step
from the guarded slope step.
  young   the first round lasts `young_interval` engine steps and each round doubles until
          `refit_interval` (EstimatorConfig, 100 as vLLM): calibrated within tens of steps of a cold start
  shift   a round whose residual sum is implausible under the current fit (|sum r| >
          shift_z * sqrt(sum p (1 - p)), a calibration z-test) keeps only `shift_keep` of the past
  prior   the start coefficients weigh `prior_slots` pseudo-slots per position (p = 1/2)
Everything depends on lossless features and recorded outcomes only: verification stays lossless.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from avkit.config import DEFAULT_K, EstimatorConfig, ForgettingConfig
from avkit.errors import ConfigError
from avkit.estimators.base import check_positions
from avkit.estimators.online_logistic import RoundLogistic
from avkit.features import CLAMP


def basis(f):
    """[...] oriented feature (numpy, or torch on its device) -> [..., 2] (f, h(f)), h(f) = -log(softplus(-f))
    clamped like the features."""
    xp = torch if isinstance(f, torch.Tensor) else np
    h = -xp.log(xp.logaddexp(xp.zeros_like(f), -f))
    return xp.stack([f, xp.clip(h, -CLAMP, CLAMP)], axis=-1)


class ForgettingLogistic(RoundLogistic):
    """Examples
    --------
    >>> est = ForgettingLogistic(k=2)
    >>> est.steps_to_refit, est.predict(np.array([0.0]), np.array([0])).round(4).tolist()
    (5, [0.4502])
    """

    name = "forgetting_logistic"
    M = 2  # basis terms
    device_round = False  # its round sums the 2-term basis: accumulated on the host (`update`)

    def __init__(self, k: int = DEFAULT_K, config: EstimatorConfig | None = None,
                 forgetting: ForgettingConfig | None = None):
        super().__init__(k, config)
        self.forgetting = forgetting or ForgettingConfig()
        self.basis_slopes = np.array([self.config.init_slope, 0.0])  # [M] w1, w2
        w = self.forgetting.prior_slots * 0.25  # p (1 - p) at p = 1/2
        self.prec_a = np.eye(self.M) * k * w  # [M, M] slope block of the precision
        self.prec_b = np.zeros((k, self.M))  # [K, M] slope-intercept coupling
        self.prec_c = np.full(k, w)  # [K] intercept precision
        self.shifts = 0  # rounds flagged as a workload shift
        self._stats = self._zero_stats()

    @property
    def slope(self) -> float:
        """The coefficient of f itself (what reports and coefficients.json call the slope)."""
        return float(self.basis_slopes[0])

    def _zero_stats(self) -> dict[str, np.ndarray]:
        m, k = self.M, self.k
        return {"a": np.zeros((m, m)), "b": np.zeros((k, m)), "c": np.zeros(k), "g0": np.zeros(m), "g1": np.zeros(k)}

    def coef(self):
        return {"basis_slopes": self.basis_slopes, "intercepts": self.intercepts}

    def _logits(self, coef, features, positions):
        return basis(features) @ coef["basis_slopes"] + coef["intercepts"][positions]

    def fit(self, *args, **kwargs):
        raise ConfigError("forgetting_logistic refits online only; batch fits use batch_logistic")

    batch_step = fit  # out-of-core batch fits call batch_step directly

    def interval(self) -> int:
        cfg = self.forgetting
        return int(min(self.config.refit_interval, cfg.young_interval * 2 ** min(self.rounds, 30)))

    def accumulate(self, features, positions, predictions, labels) -> None:
        pos = check_positions(positions, self.k)
        phi = basis(self.oriented(features))  # [N, M]
        p = np.asarray(predictions, dtype=np.float64)
        w, r = p * (1.0 - p), np.asarray(labels, dtype=np.float64) - p  # [N]
        s, k = self._stats, self.k
        s["a"] += (phi * w[:, None]).T @ phi
        s["b"] += np.stack([np.bincount(pos, weights=w * phi[:, j], minlength=k) for j in range(self.M)], 1)
        s["c"] += np.bincount(pos, weights=w, minlength=k)
        s["g0"] += phi.T @ r
        s["g1"] += np.bincount(pos, weights=r, minlength=k)
        self._round.n += np.bincount(pos, minlength=k)  # the round's slots (RoundLogistic.refit counts them)

    def reset_round(self) -> None:
        super().reset_round()
        self._stats = self._zero_stats()

    def _step(self, stats, damping) -> bool:
        """Fold the round into the forgotten precision and take one Newton step on past + round (its
        basis statistics are `self._stats`; `refit` calls this, then counts the round)."""
        s, cfg, ridge = self._stats, self.forgetting, self.config.ridge
        keep = 0.5 ** (max(self._steps, 1) / cfg.half_life)
        w = float(s["c"].sum())
        shift = w > 0 and abs(float(s["g1"].sum())) > cfg.shift_z * np.sqrt(w)
        if shift:
            keep = min(keep, cfg.shift_keep)
        self.prec_a = keep * self.prec_a + s["a"]
        self.prec_b = keep * self.prec_b + s["b"]
        self.prec_c = keep * self.prec_c + s["c"]
        inv = 1.0 / (self.prec_c + ridge)  # [K]
        schur = self.prec_a + ridge * np.eye(self.M) - self.prec_b.T @ (self.prec_b * inv[:, None])  # [M, M]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            try:
                d_slope = np.linalg.solve(schur, s["g0"] - self.prec_b.T @ (s["g1"] * inv))  # [M]
            except np.linalg.LinAlgError:
                d_slope = np.full(self.M, np.nan)
            new = self.basis_slopes + d_slope
            applied = bool(np.isfinite(d_slope).all() and new[0] >= 0 and new.sum() >= 0)  # monotone in f
            d_slope = d_slope if applied else np.zeros(self.M)
            d_int = (s["g1"] - self.prec_b @ d_slope) * inv  # [K]
        ok = np.isfinite(d_int)
        self.basis_slopes = self.basis_slopes + d_slope
        self.intercepts = np.where(ok, self.intercepts + np.where(ok, d_int, 0.0), self.intercepts)
        self.shifts += int(shift)
        return applied

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {
            "slope": self.slope, "basis_slopes": self.basis_slopes.tolist(), "shifts": self.shifts,
            "precision": {"a": self.prec_a.tolist(), "b": self.prec_b.tolist(), "c": self.prec_c.tolist()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores basis slopes and precision from its own files and snapshots; a file of
        `online_logistic` (slope, intercepts) warm-starts with w2 = 0 under the default prior and
        young rounds (the file's curvature is unknown: the traffic it now sees corrects it within
        tens of engine steps)."""
        self.basis_slopes = np.asarray(state.get("basis_slopes", [state["slope"], 0.0]), dtype=np.float64)
        super().load_state_dict(state)
        prec = state.get("precision")
        if prec is not None:
            self.prec_a = np.asarray(prec["a"], dtype=np.float64).reshape(self.M, self.M)
            self.prec_b = np.asarray(prec["b"], dtype=np.float64).reshape(self.k, self.M)
            self.prec_c = np.asarray(prec["c"], dtype=np.float64).reshape(self.k)
        else:  # another estimator's coefficients, backed by the prior's weight only: refit young again
            self.rounds = 0
        self.shifts = int(state.get("shifts", 0))
