"""metrics/uncertainty.py: the debiased squared calibration error CE2 against a brute-force loop, and its
mean on simulated perfectly calibrated data (fixed seeds, stated margins), beside the plug-in's."""

import numpy as np
import pytest

from avkit.errors import DataError
from avkit.metrics.uncertainty import cluster_bootstrap, debiased_ce2, signed_root


def _loop_ce2(y, p, clusters, n_bins=10):
    """Brute force: per bin, the cluster-robust variance of the label mean from each cluster's slots."""
    b = np.minimum((p * n_bins).astype(int), n_bins - 1)
    total = 0.0
    for k in range(n_bins):
        m = b == k
        if not m.any():
            continue
        n, ybar, s = m.sum(), y[m].mean(), p[m].mean()
        groups = [y[m & (clusters == c)] for c in np.unique(clusters[m])]
        var = 0.0
        if len(groups) > 1:
            var = len(groups) / (len(groups) - 1) * sum((g.sum() - ybar * g.size) ** 2 for g in groups) / n**2
        total += n * ((ybar - s) ** 2 - var)
    return total / y.size


def _calibrated(rng, n, clusters=None, spread=0.0):
    """Predictions p ~ Beta(8, 1.5) (most of this pair's acceptance mass is high) and labels with
    E[y | p] = p; with clusters, each cluster shifts its slots' probability by +-spread * 4p(1 - p),
    a fair coin per cluster: calibrated given p (over the draw of clusters), correlated within one."""
    p = rng.beta(8, 1.5, n)
    if clusters is None:
        return p, (rng.uniform(size=n) < p).astype(float), None
    c = rng.integers(0, clusters, n)
    sign = rng.choice([-1.0, 1.0], clusters)[c]
    return p, (rng.uniform(size=n) < p + sign * spread * 4 * p * (1 - p)).astype(float), c


def test_matches_a_brute_force_loop():
    rng = np.random.default_rng(0)
    p, y, c = _calibrated(rng, 3000, clusters=30, spread=0.1)
    q = np.clip(p - 0.03, 0, 1)  # and a miscalibrated predictor
    for probs in (p, q):
        assert debiased_ce2(y, probs, c) == pytest.approx(_loop_ce2(y, probs, c), abs=1e-14)
        assert debiased_ce2(y, probs) == pytest.approx(_loop_ce2(y, probs, np.arange(y.size)), abs=1e-14)
    # every slot its own cluster: Kumar et al.'s ybar (1 - ybar) / (n - 1) correction
    b = np.minimum((q * 10).astype(int), 9)
    kumar = sum((m.sum() * ((y[m].mean() - q[m].mean()) ** 2 - y[m].mean() * (1 - y[m].mean()) / (m.sum() - 1)))
                for m in (b == k for k in range(10)) if m.sum() > 1) / y.size
    assert debiased_ce2(y, q) == pytest.approx(kumar, abs=1e-14)


def test_mean_is_near_zero_on_calibrated_data_where_the_plug_in_is_not():
    """400 draws of 2,000 i.i.d. calibrated slots: mean CE2 within 1e-4 of 0 (~5 standard errors),
    where the plug-in squared error averages ~1e-3 (sampling noise, not miscalibration)."""
    rng = np.random.default_rng(1)
    ce2, plug = [], []
    for _ in range(400):
        p, y, _ = _calibrated(rng, 2000)
        ce2.append(debiased_ce2(y, p))
        b = np.minimum((p * 10).astype(int), 9)
        plug.append(sum(m.sum() * (y[m].mean() - p[m].mean()) ** 2 for m in (b == k for k in range(10)) if m.any())
                    / p.size)
    assert abs(np.mean(ce2)) < 1e-4 and np.mean(plug) > 5e-4
    assert 0.3 < np.mean(np.array(ce2) < 0) < 0.7  # negative about half the time


def test_clusters_correct_for_correlated_slots():
    """Calibrated given p but correlated within 20 clusters: the i.i.d. correction leaves a positive bias
    (measured 8.6e-4), the cluster-robust one does not (|mean| < 2e-4 over 400 draws: ~3 standard errors)."""
    rng = np.random.default_rng(2)
    iid, robust = [], []
    for _ in range(400):
        p, y, c = _calibrated(rng, 2000, clusters=20, spread=0.25)
        iid.append(debiased_ce2(y, p))
        robust.append(debiased_ce2(y, p, c))
    assert np.mean(iid) > 5e-4
    assert abs(np.mean(robust)) < 2e-4


def test_tracks_real_miscalibration():
    """A predictor 0.04 too low on 20,000 slots: the signed root of the mean CE2 is within 0.002 of the
    population l2 error of its bins (computed from the true probabilities)."""
    rng = np.random.default_rng(3)
    p = rng.beta(8, 1.5, 20000)
    q = np.clip(p - 0.04, 0, 1)
    b = np.minimum((q * 10).astype(int), 9)
    bins = [b == k for k in range(10)]
    truth = np.sqrt(sum(m.mean() * (p[m].mean() - q[m].mean()) ** 2 for m in bins if m.any()))
    est = [debiased_ce2((rng.uniform(size=p.size) < p).astype(float), q) for _ in range(50)]
    assert abs(signed_root(np.mean(est)) - truth) < 0.002


def test_bootstrap_resamples_are_the_estimator_on_the_resampled_slots():
    rng = np.random.default_rng(4)
    p, y, c = _calibrated(rng, 1500, clusters=25, spread=0.1)
    boot = cluster_bootstrap(y, p, c, n_boot=5, seed=7)
    names, codes = np.unique(c, return_inverse=True)
    counts = np.random.default_rng(7).multinomial(names.size, np.full(names.size, 1 / names.size), size=5)
    for k in range(5):
        # the resample as slots: cluster r's slots repeated counts[k, r] times, each copy a cluster of its own
        copies = [(np.flatnonzero(codes == r), j) for r in range(names.size) for j in range(counts[k, r])]
        idx = np.concatenate([i for i, _ in copies])
        cl = np.concatenate([np.full(i.size, n) for n, (i, _) in enumerate(copies)])
        assert boot["ce2"][k] == pytest.approx(debiased_ce2(y[idx], p[idx], cl), abs=1e-12)


def test_bad_clusters_raise():
    with pytest.raises(DataError, match="clusters has 2 entries for 3 labels"):
        debiased_ce2([0, 1, 1], [0.2, 0.5, 0.9], clusters=[0, 1])
