"""IRLS statistics and Newton steps for the acceptance estimator (docs/estimator.md).

Model: p = sigmoid(slope * f + intercept[i]) for a draft slot at position i with feature f.
Glossary (per position i, sums over the observed slots of a round, at the predictions p made
when drafting; w = p (1 - p) is the IRLS weight, r = y - p the residual):
  a_i = sum w f^2     b_i = sum w f     c_i = sum w
  g0_i = sum r f      g1_i = sum r      n_i = number of slots
The log-likelihood's gradient is (sum_i g0_i, g1_0..g1_{K-1}) and its negative Hessian is the
arrowhead matrix [[sum a, b^T], [b, diag(c)]]: one row/column couples the shared slope to every
intercept, the intercepts do not couple to each other. Adding the ridge lambda to the diagonal
and eliminating the intercepts (Schur complement) solves the (K+1)-system in O(K):
  d_slope = (sum g0 - sum b g1 / (c + lambda)) / (sum a + lambda - sum b^2 / (c + lambda))
  d_int_i = (g1_i - b_i d_slope) / (c_i + lambda)
The ridge only regularises the step (the fixed point is still the maximum-likelihood fit).
Damping scales each update by n / (n + damping), n = the slots supporting that coefficient
(all slots for the slope, position i's slots for intercept i).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

import numpy as np


STATS = ("a", "b", "c", "g0", "g1", "n")


@dataclass
class IrlsStats:
    """O(K) sufficient statistics of one refit round, additive across steps, rounds and shards: numpy on the
    host (fits, the simulator) or torch on the device (the live round, the `irls_stats` kernel's)."""

    a: np.ndarray  # [K] float64 sum w f^2
    b: np.ndarray  # [K] float64 sum w f
    c: np.ndarray  # [K] float64 sum w
    g0: np.ndarray  # [K] float64 sum r f
    g1: np.ndarray  # [K] float64 sum r
    n: np.ndarray  # [K] int64 observed slots

    @classmethod
    def zeros(cls, k: int) -> IrlsStats:
        z = np.zeros(k)
        return cls(z.copy(), z.copy(), z.copy(), z.copy(), z.copy(), np.zeros(k, dtype=np.int64))

    @classmethod
    def from_segments(cls, sums: list[tuple[float, ...]], n: np.ndarray) -> IrlsStats:
        """Per-position (a, b, c, g0, g1) tuples [K] and counts [K] -> stats."""
        cols = np.asarray(sums, dtype=np.float64).reshape(len(n), 5).T  # [5, K]
        return cls(*cols.copy(), n=np.asarray(n, dtype=np.int64))

    def fields(self) -> tuple:
        return tuple(getattr(self, name) for name in STATS)

    def numpy(self) -> IrlsStats:
        """Host copy (numpy) of device statistics: one copy of 6 K numbers (a refit's one host read)."""
        import torch  # lazy: torch (the numpy path needs none)

        if not isinstance(self.a, torch.Tensor):
            return self
        packed = torch.stack([x.double() for x in self.fields()]).cpu().numpy()  # [6, K] one transfer
        return IrlsStats(*packed[:5], n=packed[5].round().astype(np.int64))

    def __iadd__(self, other: IrlsStats) -> Self:
        for name in STATS:
            getattr(self, name).__iadd__(getattr(other, name))
        return self


def irls_stats(features: np.ndarray, positions: np.ndarray, predictions: np.ndarray,
               labels: np.ndarray, k: int) -> IrlsStats:
    """[N] feature, position, prediction at drafting time, label in {0,1} -> per-position sums."""
    w = predictions * (1.0 - predictions)  # [N]
    r = labels - predictions  # [N]
    wf = w * features
    sums = [np.bincount(positions, weights=x, minlength=k) for x in (wf * features, wf, w, r * features, r)]
    return IrlsStats(*sums, n=np.bincount(positions, minlength=k).astype(np.int64))


BLOCK = 1 << 15  # rows per block of a fused pass: its [BLOCK] temporaries stay in the L2 cache


def fused_segment_stats(f_all: np.ndarray, y: np.ndarray, slope: float, intercept: float) -> tuple[float, ...]:
    """(a, b, c, g0, g1) of one position's rows ([n] oriented feature, labels) at p = sigmoid(slope * f +
    intercept): every batch Newton pass (g0 = sum y f - sum p f, g1 = sum y - sum p). Per block of BLOCK
    rows: the design (f^2, f, 1) [3, B] in a cache-resident buffer, p = 1 / (1 + exp(-z)) (exp overflows to
    inf for z < -709: p = 0 exactly), w = p (1 - p), two float64 gemv ([f^2, f, 1] w and [f, 1] p): 3x the
    unblocked numpy pass (docs/fleet.md)."""
    acc = np.zeros(5)  # (a, b, c, sum p f, sum p)
    design = np.empty((3, min(BLOCK, f_all.size)))  # [3, B] rows (f^2, f, 1) of the current block
    design[2] = 1.0
    for lo in range(0, f_all.size, BLOCK):
        f = f_all[lo:lo + BLOCK]  # [B]
        d = design[:, :f.size]
        d[1] = f
        np.multiply(f, f, out=d[0])
        p = np.multiply(f, -slope)  # [B] -z
        p -= intercept
        with np.errstate(over="ignore"):
            np.exp(p, out=p)
        p += 1.0
        np.reciprocal(p, out=p)  # [B] p
        w = np.subtract(1.0, p)
        w *= p  # [B] w = p (1 - p)
        acc[:3] += d @ w
        acc[3:] += d[1:] @ p
    return (float(acc[0]), float(acc[1]), float(acc[2]), float(np.dot(y, f_all)) - float(acc[3]),
            float(y.sum()) - float(acc[4]))


def _damp(n: np.ndarray | float, damping: float):
    return n / (n + damping) if damping > 0 else np.ones_like(np.asarray(n, dtype=np.float64))


def shared_slope_step(s: IrlsStats, slope: float, intercepts: np.ndarray, ridge: float,
                      damping: float) -> tuple[float, np.ndarray, bool]:
    """One damped, ridged Newton step for (slope, intercepts [K]); -> (slope, intercepts, slope_applied).

    The guard (vLLM's): when the damped slope step is not finite or would make the slope negative,
    only the slope step is zeroed; each intercept still steps, from the damped, guarded slope step
        d_slope' = 0 if guarded else d_slope * n / (n + damping)
        d_int_i  = (g1_i - b_i d_slope') / (c_i + lambda) * n_i / (n_i + damping)
    so an estimator that starts where the slope cannot move still learns its intercepts (discarding
    the whole step there would freeze it for ever). A non-finite intercept step leaves that
    intercept alone, and positions with no observations keep theirs bit-identical.
    """
    seen = s.n > 0  # [K]
    if not seen.any():
        return slope, intercepts, False
    inv = 1.0 / (s.c + ridge)  # [K] 1 / (c_i + lambda); c_i = 0 for unseen positions
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        num = float(s.g0.sum()) - np.dot(s.b * inv, s.g1)  # the intercepts eliminated (Schur complement)
        den = float(s.a.sum()) + ridge - np.dot(s.b * s.b, inv)
        d_slope = float(num / den) * _damp(float(s.n.sum()), damping)  # not finite when singular: guarded
        applied = bool(np.isfinite(d_slope) and slope + d_slope >= 0)
        d_slope = d_slope if applied else 0.0
        d_int = (s.g1 - s.b * d_slope) * inv * _damp(s.n.astype(np.float64), damping)  # [K]
    step = seen & np.isfinite(d_int)  # [K]
    new_int = intercepts.copy()
    new_int[step] = intercepts[step] + d_int[step]
    return float(slope + d_slope), new_int, applied


def per_position_step(s: IrlsStats, slopes: np.ndarray, intercepts: np.ndarray, ridge: float,
                      damping: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ablation: an independent 2x2 Newton step per position for (slope_i, intercept_i).

    -> (slopes [K], intercepts [K], slope applied [K] bool). The guard is the shared-slope one per
    position: a slope step that is not finite or makes the slope negative is zeroed and the intercept
    steps from the guarded slope step; unseen positions are untouched.
    """
    # [[a+l, b], [b, c+l]] [ds, di]^T = [g0, g1]^T; eliminating the intercept gives the slope step.
    seen = s.n > 0  # [K]
    scale = _damp(s.n.astype(np.float64), damping)  # [K]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = 1.0 / (s.c + ridge)
        d_slope = (s.g0 - s.b * s.g1 * inv) / (s.a + ridge - s.b * s.b * inv) * scale  # [K]
        ok = seen & np.isfinite(d_slope) & (slopes + d_slope >= 0)  # [K]
        d_slope = np.where(ok, d_slope, 0.0)
        d_int = (s.g1 - s.b * d_slope) * inv * scale  # [K]
    step = seen & np.isfinite(d_int)
    out_s, out_i = slopes + d_slope, intercepts.copy()
    out_i[step] = intercepts[step] + d_int[step]
    return out_s, out_i, ok


def group_by_position(positions: np.ndarray) -> np.ndarray:
    """[N] positions -> [N] stable permutation grouping rows by position (int16 keys: numpy's radix sort)."""
    return np.argsort(np.asarray(positions).astype(np.int16), kind="stable")


def newton_iterations(ests: list, stats_of: Callable[[list[int]], list[IrlsStats]], max_iter: int, tol: float,
                      on_step: Callable[[int, int], None] | None = None) -> int:
    """Batch IRLS of several estimators at once: each iteration sums the statistics of those still moving
    (`stats_of(indices)`, at their current coefficients) and takes each one's undamped Newton step
    (`batch_step`); one stops when its step is rejected or max |step| < tol. on_step(i, iteration) follows
    estimator i's step; -> the iterations run."""
    active = list(range(len(ests)))
    for it in range(max_iter):
        if not active:
            return it
        still = []
        for i, stats in zip(active, stats_of(active)):
            before = ests[i].coefficients()
            applied = ests[i].batch_step(stats)
            if on_step is not None:
                on_step(i, it)
            if applied and np.max(np.abs(ests[i].coefficients() - before)) >= tol:
                still.append(i)
        active = still
    return max_iter
