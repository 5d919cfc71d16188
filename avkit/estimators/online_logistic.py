"""The acceptance estimator: p_i = sigmoid(slope * f + intercept_i), refit online in rounds.

Glossary:
  feature     one lossless scalar per draft slot; the estimator multiplies it by its FeatureSpec
              sign (-1 for entropy) so that larger means more confident and the slope is >= 0  [N]
  position    draft position i in [0, K)                                                          [N]
  round       `refit_interval` engine steps; its O(K) IRLS statistics (estimators/irls.py) are
              summed at the predictions made when drafting, then one damped Newton step is taken
              from that round's statistics only (vLLM's Adaptive Verification estimator). A round
              refits only once it is full: a run that stops mid-round drops its open statistics
  guard       a slope step that is NaN or would make the slope negative is zeroed; the intercepts
              still step, from the damped, guarded slope step (vLLM's rule; estimators/irls.py)
  batch fit   the same Newton step iterated on all observed slots to convergence (undamped:
              damping protects online refits from small rounds; the fixed point is the MLE)
Reference constants (EstimatorConfig): slope 0.5, intercepts -0.2, N = 100, ridge 1e-3,
damping n / (n + 50).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from avkit.config import DEFAULT_K, EstimatorConfig
from avkit.errors import DataError
from avkit.estimators.base import check_positions, sigmoid
from avkit.estimators.irls import (IrlsStats, fused_segment_stats, group_by_position, irls_stats, newton_iterations,
                                   per_position_step, shared_slope_step)
from avkit.features import FEATURES


def sigmoid_torch(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (1.0 + torch.tanh(0.5 * x))  # the numpy path's overflow-free logistic, term for term


class RoundLogistic:
    """Online rounds and batch fitting shared by the logistic estimators. A subclass names its coefficients
    (`coef()`: name -> float64 array, the first its slope(s), the last the intercepts) and gives
    `_logits(coef, f, pos)` (numpy, or torch from the device mirrors of `coef()`) and `_step(stats,
    damping)` (one Newton step; True if the slope step was applied). Inputs are numpy arrays (or CPU
    tensors) of one engine step or round."""

    name = "round_logistic"
    device_round = True  # the live round's statistics may be summed on the device (`add_round`)

    def __init__(self, k: int = DEFAULT_K, config: EstimatorConfig | None = None):
        config = config or EstimatorConfig()
        self.k, self.config = k, config
        spec = FEATURES.get(config.feature)
        self.lossless = True if spec is None else spec.lossless
        self.sign = 1.0 if spec is None else spec.sign  # features are oriented: larger = more confident
        self.intercepts = np.full(k, config.init_intercept)  # [K]
        self.observations = np.zeros(k, dtype=np.int64)  # [K] slots seen by applied and rejected refits
        self.rounds = 0  # completed refit rounds (or batch iterations)
        self.rejected = 0  # rounds whose step was rejected by a guard
        self._round = IrlsStats.zeros(k)
        self._steps = 0
        self._mirrors: dict[tuple[torch.device, torch.dtype], dict[str, torch.Tensor]] = {}

    def oriented(self, features) -> np.ndarray:
        """[N] feature times its FeatureSpec sign (larger = more confident), float64."""
        f = np.asarray(features, dtype=np.float64)
        return f if self.sign == 1.0 else self.sign * f

    def coefficients(self) -> np.ndarray:
        """All coefficients as one flat vector (convergence checks, trajectories)."""
        return np.concatenate([np.atleast_1d(a) for a in self.coef().values()])

    def on_device(self, device, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
        """Tensor mirrors of `coef()` on `device`, created on first use and refreshed in place after every
        change (`_moved`): the live step predicts on the device and the confidence kernel holds them, so
        nothing the step computes waits for the host."""
        key = (torch.device(device), dtype)
        if key not in self._mirrors:
            self._mirrors[key] = {n: torch.as_tensor(np.atleast_1d(a), dtype=dtype).to(key[0])
                                  for n, a in self.coef().items()}
        return self._mirrors[key]

    def _moved(self) -> None:
        arrays = self.coef()
        for mirror in self._mirrors.values():
            for n, t in mirror.items():
                t.copy_(torch.as_tensor(np.atleast_1d(arrays[n]), dtype=t.dtype), non_blocking=True)

    def predict(self, features: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """[N] feature, [N] position -> [N] acceptance probabilities."""
        return sigmoid(self._logits(self.coef(), self.oriented(features), check_positions(positions, self.k)))

    def predict_torch(self, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`predict` on the features' device (float64 as the numpy path; no host read): [...] -> [...]."""
        f = features.double() if self.sign == 1.0 else self.sign * features.double()
        return sigmoid_torch(self._logits(self.on_device(features.device), f, positions))

    @property
    def steps_to_refit(self) -> int:
        """Engine steps still to feed before this round refits (>= 1): a replay predicts them at once."""
        return self.interval() - self._steps

    def interval(self) -> int:
        """Engine steps in the current round (a constant `refit_interval` here)."""
        return self.config.refit_interval

    def _check_steps(self, steps: int) -> None:
        if not 0 <= steps <= self.steps_to_refit:
            raise ValueError(f"steps={steps}: a call may feed 0..{self.steps_to_refit} engine steps")

    def update(self, features, positions, predictions, labels, steps: int = 1) -> bool:
        """Feed the observed slots of `steps` engine steps (a replay: up to `steps_to_refit`); True when the
        round filled and was refitted. THE online round of live, the simulator and `avkit fit`."""
        self._check_steps(steps)
        self.accumulate(features, positions, predictions, labels)
        return self._advance(steps)

    def add_round(self, stats: IrlsStats, steps: int = 1) -> bool:
        """`update` from statistics already summed (numpy, or device tensors of the `irls_stats` kernel at the
        oriented feature); a device round is read to the host once, when it refits (6 K numbers)."""
        self._check_steps(steps)
        if isinstance(stats.a, torch.Tensor) and not isinstance(self._round.a, torch.Tensor):
            self._round = IrlsStats(*(torch.zeros_like(x) for x in stats.fields()))
        self._round += stats
        return self._advance(steps)

    def accumulate(self, features, positions, predictions, labels) -> None:
        """Add observed slots ([N] each) to the current round's statistics (no refit)."""
        pos = check_positions(positions, self.k)
        self._round += irls_stats(self.oriented(features), pos, np.asarray(predictions, dtype=np.float64),
                                  np.asarray(labels, dtype=np.float64), self.k)

    def _advance(self, steps: int) -> bool:
        """Count `steps` engine steps into the round; refit when it is full (True)."""
        self._steps += steps
        if self._steps < self.interval():
            return False
        self._round = self._round.numpy()  # a device round's one host read (6 K numbers)
        self.refit()
        return True

    def refit(self) -> bool:
        """Close the round: one Newton step from its statistics; True if the slope step was applied."""
        applied = self._step(self._round, self.config.damping)
        self.observations += self._round.n
        self.rounds += 1
        self.rejected += int(not applied and self._round.n.any())
        self.reset_round()
        self._moved()
        return applied

    def reset_round(self) -> None:
        """Drop the open round's statistics (a run ended before the round was full: live, they are lost)."""
        self._round, self._steps = IrlsStats.zeros(self.k), 0

    def fit(self, features, positions, labels, *, max_iter: int = 50, tol: float = 1e-10,
            on_iteration: Callable[[RoundLogistic], None] | None = None) -> int:
        """Batch fit of rows in memory, the batch fit over shards (fit/passes.py) on one chunk: the
        (undamped) Newton step iterated until max |step| < tol; -> the iterations run. `observations`
        becomes the per-position row counts."""
        pos = check_positions(positions, self.k)
        order = group_by_position(pos)
        f, y, pos = np.asarray(features, dtype=np.float64)[order], np.asarray(labels, dtype=np.float64)[order], pos[order]
        counts = np.bincount(pos, minlength=self.k)  # [K]
        return newton_iterations([self], lambda _: [self.newton_stats(f, y, pos, counts)], max_iter, tol,
                                 None if on_iteration is None else lambda i, it: on_iteration(self))

    def newton_stats(self, features, labels, positions, counts, keep=None) -> IrlsStats:
        """One batch Newton pass's IRLS sums at the current coefficients over rows sorted by position ([n]
        raw feature, labels, positions; [K] rows per position; `keep` [n] bool: only those rows)."""
        f, y = self.oriented(features), labels
        if keep is not None:
            f, y, counts = f[keep], y[keep], np.bincount(positions[keep], minlength=self.k)
        slopes = np.broadcast_to(next(iter(self.coef().values())), self.k)  # [K] each position's slope
        bounds = np.r_[0, np.cumsum(counts)]  # [K + 1] each position's rows: one segment
        return IrlsStats.from_segments([fused_segment_stats(f[lo:hi], y[lo:hi], slopes[i], self.intercepts[i])
                                        for i, (lo, hi) in enumerate(itertools.pairwise(bounds))], counts)

    def batch_step(self, stats: IrlsStats) -> bool:
        """One undamped Newton step of a batch fit from ALL observed slots' statistics at the current
        coefficients (summed over chunks or shards out of core); True if applied."""
        applied = self._step(stats, 0.0)
        self.rounds += 1
        self.observations = stats.n.astype(np.int64)
        self._moved()
        return applied

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "feature": self.config.feature, "num_positions": self.k,
                "intercepts": self.intercepts.tolist(), "observations": self.observations.tolist(),
                "rounds": self.rounds, "rejected": self.rejected}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["num_positions"]) != self.k:
            raise DataError(f"state has num_positions {state['num_positions']}, estimator has {self.k}")
        if state.get("feature", self.config.feature) != self.config.feature:
            raise DataError(f"state was fitted on feature {state['feature']!r}, this estimator uses "
                            f"{self.config.feature!r}")
        self.intercepts = np.asarray(state["intercepts"], dtype=np.float64)
        self.observations = np.asarray(state.get("observations", [0] * self.k), dtype=np.int64)
        self.rounds, self.rejected = int(state.get("rounds", 0)), int(state.get("rejected", 0))
        self._moved()


class OnlineLogistic(RoundLogistic):
    """One slope shared by all positions, one intercept per position: K + 1 parameters.

    >>> OnlineLogistic(k=2).predict(np.array([0.0, 2.0]), np.array([0, 1])).round(4).tolist()
    [0.4502, 0.69]
    """

    name = "online_logistic"

    def __init__(self, k: int = DEFAULT_K, config: EstimatorConfig | None = None):
        super().__init__(k, config)
        self.slope = float(self.config.init_slope)

    def coef(self):
        return {"slope": np.float64(self.slope), "intercepts": self.intercepts}

    def _logits(self, coef, features, positions):
        return coef["slope"] * features + coef["intercepts"][positions]

    def kernel_coefficients(self, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(slope [1], intercepts [K]) float32 on `device` when the prediction is the confidence kernel's
        sigma(slope * logit(q_max) + intercept_i) (kernels/confidence_ref.py), else None."""
        if self.sign != 1.0 or self.config.feature != "logit_qmax":
            return None
        coef = self.on_device(device, torch.float32)
        return coef["slope"], coef["intercepts"]

    def _step(self, stats, damping):
        self.slope, self.intercepts, applied = shared_slope_step(
            stats, self.slope, self.intercepts, self.config.ridge, damping)
        return applied

    def state_dict(self):
        return super().state_dict() | {"slope": self.slope}

    def load_state_dict(self, state):
        self.slope = float(state["slope"])
        super().load_state_dict(state)


class BatchLogistic(OnlineLogistic):
    """The same model fitted to convergence (`fit`, batch passes); fed online it keeps its coefficients."""

    name = "batch_logistic"
    device_round = False  # never refits online

    def update(self, features, positions, predictions, labels, steps: int = 1) -> bool:
        return False


class PerPositionSlope(RoundLogistic):
    """Ablation: a slope per position, p_i = sigmoid(slope_i * f + intercept_i): 2K parameters, with the same
    rounds, statistics, ridge, damping and guards; the Newton step is an independent 2x2 solve per position
    (`irls.per_position_step`). It asks whether the shared slope costs accuracy.

    >>> PerPositionSlope(k=2).slopes.tolist()
    [0.5, 0.5]
    """

    name = "per_position_slope"

    def __init__(self, k: int = DEFAULT_K, config: EstimatorConfig | None = None):
        super().__init__(k, config)
        self.slopes = np.full(k, self.config.init_slope)  # [K]

    def coef(self):
        return {"slopes": self.slopes, "intercepts": self.intercepts}

    def _logits(self, coef, features, positions):
        return coef["slopes"][positions] * features + coef["intercepts"][positions]

    def _step(self, stats, damping):
        self.slopes, self.intercepts, ok = per_position_step(
            stats, self.slopes, self.intercepts, self.config.ridge, damping)
        return bool(ok.any())

    def state_dict(self):
        return super().state_dict() | {"slopes": self.slopes.tolist()}

    def load_state_dict(self, state):
        self.slopes = np.asarray(state["slopes"], dtype=np.float64)
        super().load_state_dict(state)
