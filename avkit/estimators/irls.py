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

from dataclasses import dataclass
from typing import Self

import numpy as np


@dataclass
class IrlsStats:
    """O(K) sufficient statistics of one refit round; additive across steps, rounds and shards."""

    a: np.ndarray  # [K] sum w f^2
    b: np.ndarray  # [K] sum w f
    c: np.ndarray  # [K] sum w
    g0: np.ndarray  # [K] sum r f
    g1: np.ndarray  # [K] sum r
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

    def __iadd__(self, other: IrlsStats) -> Self:
        for name in ("a", "b", "c", "g0", "g1", "n"):
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


def segment_stats(f: np.ndarray, f2: np.ndarray, y: np.ndarray, p: np.ndarray) -> tuple[float, ...]:
    """(a, b, c, g0, g1) of ONE position's rows ([n] each, f2 = f*f precomputed): BLAS dots,
    no scattered writes. A batch fit keeps rows grouped by position and calls this per position."""
    w = p * (1.0 - p)
    r = y - p
    return float(np.dot(w, f2)), float(np.dot(w, f)), float(w.sum()), float(np.dot(r, f)), float(r.sum())


def _damp(n: np.ndarray | float, damping: float):
    return n / (n + damping) if damping > 0 else np.ones_like(np.asarray(n, dtype=np.float64))


def shared_slope_step(s: IrlsStats, slope: float, intercepts: np.ndarray, ridge: float,
                      damping: float) -> tuple[float, np.ndarray, bool]:
    """One damped, ridged Newton step for (slope, intercepts [K]); -> (slope, intercepts, applied).

    The step is rejected (coefficients returned unchanged, applied=False) when it is not finite or
    would make the slope negative. Positions with no observations keep their intercept bit-identical.
    """
    seen = s.n > 0  # [K]
    if not seen.any():
        return slope, intercepts, False
    inv = 1.0 / (s.c + ridge)  # [K] 1 / (c_i + lambda); c_i = 0 for unseen positions
    num = s.g0.sum() - np.dot(s.b * inv, s.g1)
    den = s.a.sum() + ridge - np.dot(s.b * s.b, inv)  # Schur complement of diag(c) + lambda I
    with np.errstate(divide="ignore", invalid="ignore"):
        d_slope = num / den
        d_int = (s.g1 - s.b * d_slope) * inv  # [K]
    new_slope = slope + d_slope * _damp(float(s.n.sum()), damping)
    if not (np.isfinite(new_slope) and np.isfinite(d_int[seen]).all()) or new_slope < 0:
        return slope, intercepts, False
    new_int = intercepts.copy()
    new_int[seen] = intercepts[seen] + d_int[seen] * _damp(s.n[seen], damping)
    return float(new_slope), new_int, True


def per_position_step(s: IrlsStats, slopes: np.ndarray, intercepts: np.ndarray, ridge: float,
                      damping: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ablation: an independent 2x2 Newton step per position for (slope_i, intercept_i).

    -> (slopes [K], intercepts [K], applied [K] bool); a position's step is rejected when it is
    not finite or makes its slope negative, and unseen positions are untouched.
    """
    # [[a+l, b], [b, c+l]] [ds, di]^T = [g0, g1]^T, solved in closed form per position.
    det = (s.a + ridge) * (s.c + ridge) - s.b * s.b  # [K]
    with np.errstate(divide="ignore", invalid="ignore"):
        d_slope = ((s.c + ridge) * s.g0 - s.b * s.g1) / det
        d_int = ((s.a + ridge) * s.g1 - s.b * s.g0) / det
    scale = _damp(s.n.astype(np.float64), damping)
    new_slopes = slopes + d_slope * scale
    ok = (s.n > 0) & np.isfinite(d_slope) & np.isfinite(d_int) & (new_slopes >= 0)  # [K]
    out_s, out_i = slopes.copy(), intercepts.copy()
    out_s[ok] = new_slopes[ok]
    out_i[ok] = intercepts[ok] + d_int[ok] * scale[ok]
    return out_s, out_i, ok


__all__ = ["IrlsStats", "irls_stats", "per_position_step", "segment_stats", "shared_slope_step"]
