"""Uncertainty of ECE and log-loss on one trace: a cluster bootstrap, and the ECE of perfect calibration.

  clusters  [N] int codes of the unit resampled (a request: its slots share one context)
  resample  R clusters drawn with replacement out of R, cluster r counted m_r times: exactly `ece` /
            `log_loss` with sample_weight m_{cluster(n)}, as the counts matrix times each cluster's
            additive sums (metrics/calibration.py)
  floor     the mean ECE over labels drawn y* ~ Bernoulli(p) (consistency resampling, Broecker and
            Smith 2007): what a perfectly calibrated predictor shows on these N slots
  ce2       the debiased squared calibration error (metrics/debiased.py) of each resample
"""

from __future__ import annotations

import numpy as np

from avkit.metrics.calibration import additive_sums, check_binary_inputs, ece_from_bins
from avkit.metrics.debiased import ce2_from_stats, cluster_stats


def cluster_bootstrap(labels, probs, clusters, *, n_boot: int = 1000, n_bins: int = 10,
                      seed: int = 0) -> dict[str, np.ndarray]:
    """-> {"ece": [n_boot], "log_loss": [n_boot], "ce2": [n_boot]} over cluster resamples (the same resamples for the
    same `clusters`, `n_boot` and `seed`: two predictors' draws are paired)."""
    y, p, _ = check_binary_inputs(labels, probs, name="probs", probabilities=True)
    _, codes = np.unique(np.asarray(clusters), return_inverse=True)  # [N] 0..R-1
    r = int(codes.max()) + 1
    nll, table = additive_sums(p, y, codes, 1, r, n_bins)  # [1, R], [3, 1, R, n_bins]
    counts = np.random.default_rng(seed).multinomial(r, np.full(r, 1.0 / r), size=n_boot).astype(np.float64)  # [B, R]
    boot = np.einsum("br,crk->cbk", counts, table[:, 0])  # [3, B, n_bins]
    ce2 = ce2_from_stats(np.einsum("br,crk->cbk", counts, cluster_stats(table[:, 0])))  # [B]
    return {"ece": ece_from_bins(boot), "log_loss": counts @ nll[0] / boot[0].sum(-1), "ce2": ce2}


def ece_floor(probs, *, n_draws: int = 200, n_bins: int = 10, seed: int = 0) -> float:
    """Mean ECE of `probs` against labels drawn from them (perfect calibration, same N)."""
    _, p, _ = check_binary_inputs(np.zeros(len(probs)), probs, name="probs", probabilities=True)
    rng = np.random.default_rng(seed)
    y = (rng.random((n_draws, p.size)) < p).astype(np.float64)  # [D, N]
    _, table = additive_sums(np.tile(p, n_draws), y.ravel(), np.repeat(np.arange(n_draws), p.size), 1, n_draws,
                             n_bins)
    return float(ece_from_bins(table[:, 0]).mean())
