"""Bootstrap intervals over recorded requests: a resample draws R requests with replacement (weights w [B, R]),
throughput (w @ tokens) / (w @ time). The same weights serve every cell, so a ratio is paired. The replay is
not rerun per resample: the intervals measure which requests the traces hold, not the simulator's error.
"""

from __future__ import annotations

import numpy as np


def resample_weights(num_requests: int, draws: int, seed: int) -> np.ndarray:
    """[draws, num_requests] multinomial counts, each row summing to num_requests (fixed seed).

    Examples
    --------
    >>> w = resample_weights(5, 3, seed=0)
    >>> w.shape, w.sum(axis=1).tolist()
    ((3, 5), [5, 5, 5])
    """
    rng = np.random.default_rng(seed)
    return rng.multinomial(num_requests, np.full(num_requests, 1.0 / num_requests), size=draws).astype(np.float64)


def resampled_rate(weights: np.ndarray, tokens: np.ndarray, time_ms: np.ndarray) -> np.ndarray:
    """[B] tokens per second under each resample: weights [B, R], tokens [R], time_ms [R]."""
    return 1e3 * (weights @ tokens) / np.maximum(weights @ time_ms, 1e-300)


def interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """Equal-tailed percentile interval of bootstrap samples [B]."""
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(samples, [tail, 100.0 - tail])
    return float(lo), float(hi)
