"""metrics/uncertainty.py: each cluster resample is the weighted metric (sklearn's log-loss and a loop ECE
as oracles), and the ECE floor is the ECE of labels drawn from the predictions."""

import numpy as np

from avkit.metrics import ece
from avkit.metrics.uncertainty import cluster_bootstrap, ece_floor


def _clustered(n=3000, clusters=40, seed=0):
    rng = np.random.default_rng(seed)
    c = rng.integers(0, clusters, n)
    shift = rng.normal(0, 0.8, clusters)[c]  # a per-cluster level: slots of a cluster are correlated
    p = 1 / (1 + np.exp(-(rng.normal(1.5, 1.5, n))))
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(np.log(p / (1 - p)) + shift)))).astype(float)
    return y, p, np.array([f"req{i}" for i in c])


def _loop_ece(y, p, w, n_bins=10):
    err = 0.0
    for b in range(n_bins):
        m = np.minimum((p * n_bins).astype(int), n_bins - 1) == b
        if w[m].sum() > 0:
            err += abs(np.dot(w[m], p[m]) - np.dot(w[m], y[m]))
    return err / w.sum()


def test_each_resample_is_the_metric_weighted_by_cluster_counts():
    import sklearn.metrics as skm  # lazy: heavy, imported by the tests that use it
    y, p, c = _clustered()
    boot = cluster_bootstrap(y, p, c, n_boot=20, seed=3)
    names, codes = np.unique(c, return_inverse=True)
    counts = np.random.default_rng(3).multinomial(names.size, np.full(names.size, 1 / names.size), size=20)
    for b in range(20):
        w = counts[b][codes].astype(float)  # [N] each slot counted as often as its cluster was drawn
        keep = w > 0
        assert abs(boot["ece"][b] - _loop_ece(y, p, w)) < 1e-12
        assert abs(boot["ece"][b] - ece(y[keep], p[keep], sample_weight=w[keep])) < 1e-12
        assert abs(boot["log_loss"][b] - skm.log_loss(y[keep], p[keep], sample_weight=w[keep])) < 1e-12


def test_same_seed_pairs_the_resamples_and_the_interval_covers_the_estimate():
    import sklearn.metrics as skm  # lazy: heavy, imported by the tests that use it
    y, p, c = _clustered()
    a = cluster_bootstrap(y, p, c, n_boot=200, seed=1)
    b = cluster_bootstrap(y, 0.98 * p, c, n_boot=200, seed=1)
    unpaired = cluster_bootstrap(y, 0.98 * p, c, n_boot=200, seed=2)
    # paired: the same clusters were drawn, so the log-loss difference varies far less than unpaired
    assert np.std(a["log_loss"] - b["log_loss"]) < 0.2 * np.std(a["log_loss"] - unpaired["log_loss"])
    lo, hi = np.percentile(a["log_loss"], [2.5, 97.5])
    assert lo < skm.log_loss(y, p) < hi


def test_floor_is_the_ece_of_a_calibrated_predictor_and_shrinks_with_n():
    """Labels drawn from p: their ECE averages the floor (margin: 4 standard errors over 200 draws)."""
    rng = np.random.default_rng(0)
    p = rng.beta(8, 1.5, 2000)
    draws = [ece((rng.uniform(size=p.size) < p).astype(float), p) for _ in range(200)]
    floor = ece_floor(p, n_draws=400, seed=1)
    assert abs(np.mean(draws) - floor) < 4 * np.std(draws) / np.sqrt(200)
    big = ece_floor(np.tile(p, 16), n_draws=50, seed=1)
    assert 0.15 < big / floor < 0.4  # ~ 1 / sqrt(16) = 0.25: the floor is sampling noise
