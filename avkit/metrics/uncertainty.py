"""How sure the calibration of one trace is: a cluster bootstrap, the ECE of perfect calibration, and the
debiased calibration error: the squared (l2) binned calibration error less its finite-sample bias, bin
by bin (Kumar, Liang and Ma 2019, §5, with a cluster-robust variance: slots of one request are correlated;
docs/estimator.md). In bin b (n_b slots, mean prediction s_b, label mean ybar_b):

  CE2 = sum_b (n_b / N) [(ybar_b - s_b)^2 - V_b]
  V_b = G_b / (G_b - 1) * sum_r (S_rb - ybar_b n_rb)^2 / n_b^2      (0 where G_b < 2)

with n_rb slots and S_rb accepted ones of cluster r (a request) in bin b and G_b clusters in the bin
(every slot its own cluster: Kumar et al.'s ybar_b (1 - ybar_b) / (n_b - 1)). Reported as the signed
root sgn(CE2) sqrt|CE2|, an l2 error that bounds the l1 ECE of the same bins from above (Jensen).
Per-cluster sums (additive over clusters, so a bootstrap resample is a counts matrix times them):
  stats [7, ..., n_bins]: n, sum p, sum y, sum_r n_rb^2, sum_r n_rb S_rb, sum_r S_rb^2, G_b

Cluster bootstrap and floor:
  clusters  [N] int codes of the unit resampled (a request: its slots share one context)
  resample  R clusters drawn with replacement out of R, cluster r counted m_r times: exactly `ece` /
            `log_loss` with sample_weight m_{cluster(n)}, as the counts matrix times each cluster's
            additive sums (metrics/calibration.py)
  floor     the mean ECE over labels drawn y* ~ Bernoulli(p) (consistency resampling, Broecker and
            Smith 2007): what a perfectly calibrated predictor shows on these N slots
"""

from __future__ import annotations

import numpy as np

from avkit.errors import DataError
from avkit.metrics.calibration import additive_sums, check_binary_inputs, check_n_bins, ece_from_bins


def resample_weights(num_clusters: int, draws: int, seed: int) -> np.ndarray:
    """[draws, num_clusters] counts of a cluster bootstrap (each row draws num_clusters clusters with replacement;
    fixed seed): the resamples of `cluster_bootstrap` and of `avkit tune`'s intervals (recorded requests).

    Examples
    --------
    >>> w = resample_weights(5, 3, seed=0)
    >>> w.shape, w.sum(axis=1).tolist()
    ((3, 5), [5.0, 5.0, 5.0])
    """
    rng = np.random.default_rng(seed)
    return rng.multinomial(num_clusters, np.full(num_clusters, 1.0 / num_clusters), size=draws).astype(np.float64)


def cluster_stats(per_cluster: np.ndarray) -> np.ndarray:
    """[3, ..., R, n_bins] each cluster's (count, sum p, sum y) per bin (metrics/calibration.py additive_sums with the
    clusters as groups) -> [7, ..., R, n_bins] each cluster's stats (the module glossary)."""
    n, sp, sy = per_cluster
    return np.stack([n, sp, sy, n * n, n * sy, sy * sy, (n > 0).astype(np.float64)])


def ce2_from_stats(stats: np.ndarray) -> np.ndarray:
    """[7, ..., n_bins] stats summed over clusters -> [...] CE2."""
    n, sum_p, sum_y, nn, ns, ss, g = stats
    with np.errstate(invalid="ignore", divide="ignore"):
        ybar = sum_y / n
        gap2 = (ybar - sum_p / n) ** 2
        var = g / (g - 1.0) * (ss - 2.0 * ybar * ns + ybar**2 * nn) / n**2
    term = np.where(g > 1, n * (gap2 - var), np.where(n > 0, n * gap2, 0.0))
    return term.sum(-1) / n.sum(-1)


def signed_root(ce2):
    """CE2 (scalar or array) -> sgn(CE2) sqrt|CE2|, the debiased l2 calibration error."""
    return np.sign(ce2) * np.sqrt(np.abs(ce2))


def debiased_ce2(labels, probs, clusters=None, n_bins: int = 10) -> float:
    """CE2: the squared binned calibration error less its estimated sampling bias (may be negative);
    `clusters` [N] (None: every slot its own) are the units whose slots may be correlated.

    Examples
    --------
    >>> round(debiased_ce2([1, 0, 1, 1, 0], [0.9, 0.1, 0.8, 0.8, 0.6]), 6)
    0.092
    """
    _, per_cluster = _cluster_sums(labels, probs, clusters, check_n_bins(n_bins))
    return float(ce2_from_stats(cluster_stats(per_cluster).sum(1)))


def _cluster_sums(labels, probs, clusters, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Checked inputs -> ([R] summed NLL, [3, R, n_bins] ECE bins) of each cluster (None: every slot its own)."""
    y, p, _ = check_binary_inputs(labels, probs, name="probs", probabilities=True)
    codes = np.arange(y.size) if clusters is None else np.unique(np.asarray(clusters), return_inverse=True)[1]
    if codes.size != y.size:
        raise DataError(f"clusters has {codes.size} entries for {y.size} labels")
    nll, table = additive_sums(p, y, codes, 1, int(codes.max()) + 1, n_bins)  # [1, R], [3, 1, R, n_bins]
    return nll[0], table[:, 0]


def cluster_bootstrap(labels, probs, clusters, *, n_boot: int = 1000, n_bins: int = 10,
                      seed: int = 0) -> dict[str, np.ndarray]:
    """-> {"ece": [n_boot], "log_loss": [n_boot], "ce2": [n_boot]} over cluster resamples (the same resamples for the
    same `clusters`, `n_boot` and `seed`: two predictors' draws are paired)."""
    nll, table = _cluster_sums(labels, probs, clusters, n_bins)  # [R], [3, R, n_bins]
    counts = resample_weights(nll.size, n_boot, seed)  # [B, R]
    boot = np.einsum("br,crk->cbk", counts, table)  # [3, B, n_bins]
    ce2 = ce2_from_stats(np.einsum("br,crk->cbk", counts, cluster_stats(table)))  # [B]
    return {"ece": ece_from_bins(boot), "log_loss": counts @ nll / boot[0].sum(-1), "ce2": ce2}


def ece_floor(probs, *, n_draws: int = 200, n_bins: int = 10, seed: int = 0) -> float:
    """Mean ECE of `probs` against labels drawn from them (perfect calibration, same N)."""
    _, p, _ = check_binary_inputs(np.zeros(len(probs)), probs, name="probs", probabilities=True)
    rng = np.random.default_rng(seed)
    y = (rng.random((n_draws, p.size)) < p).astype(np.float64)  # [D, N]
    _, table = additive_sums(np.tile(p, n_draws), y.ravel(), np.repeat(np.arange(n_draws), p.size), 1, n_draws,
                             n_bins)
    return float(ece_from_bins(table[:, 0]).mean())
