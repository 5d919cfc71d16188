"""Acceptance estimators: the Newton step against a dense solve, the batch fit against statsmodels,
online recovery of a synthetic truth, damping, guards, and registry-driven protocol checks."""

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from avkit.config import EstimatorConfig, SyntheticConfig
from avkit.errors import DataError
from avkit.estimators import ESTIMATORS, make_estimator
from avkit.estimators.irls import irls_stats, per_position_step, shared_slope_step
from avkit.fit.data import load_fit_data
from avkit.fit.replay import online_replay
from avkit.trace.synthetic import synthetic_trace, write_synthetic_trace

K = 7


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    """Observed slots of a 40k-slot synthetic trace (seed 3)."""
    path = write_synthetic_trace(tmp_path_factory.mktemp("t") / "t.parquet", SyntheticConfig(num_slots=40_000, seed=3))
    return load_fit_data([path])


def _random_stats(seed=0, k=K, empty=()):
    rng = np.random.default_rng(seed)
    f = rng.normal(1, 2, 3000)
    pos = rng.integers(0, k, 3000)
    keep = ~np.isin(pos, empty)
    p = 1 / (1 + np.exp(-(0.5 * f - 0.2)))
    y = (rng.uniform(size=3000) < 1 / (1 + np.exp(-(0.7 * f + 0.3)))).astype(float)
    return irls_stats(f[keep], pos[keep], p[keep], y[keep], k)


def test_schur_step_equals_dense_solve():
    s = _random_stats()
    lam = 1e-3
    h = np.zeros((K + 1, K + 1))  # arrowhead: slope row/column couples to every intercept
    h[0, 0] = s.a.sum() + lam
    h[0, 1:] = h[1:, 0] = s.b
    h[1:, 1:] = np.diag(s.c + lam)
    delta = np.linalg.solve(h, np.r_[s.g0.sum(), s.g1])
    slope, ints, ok = shared_slope_step(s, 0.5, np.full(K, -0.2), lam, 0.0)
    assert ok
    np.testing.assert_allclose(np.r_[slope - 0.5, ints + 0.2], delta, rtol=1e-10, atol=1e-12)


def test_damping_scales_by_n_over_n_plus_c():
    s = _random_stats(seed=1)
    ints0 = np.full(K, -0.2)
    slope_u, _, _ = shared_slope_step(s, 0.5, ints0, 1e-3, 0.0)
    slope_d, ints_d, _ = shared_slope_step(s, 0.5, ints0, 1e-3, 50.0)
    n = s.n.sum()
    assert slope_d - 0.5 == pytest.approx((slope_u - 0.5) * n / (n + 50), rel=1e-12)
    # vLLM's intercept step: from the DAMPED slope step, then damped by its own position's count
    expected = (s.g1 - s.b * (slope_d - 0.5)) / (s.c + 1e-3) * s.n / (s.n + 50)
    np.testing.assert_allclose(ints_d - ints0, expected, rtol=1e-12)


def test_unobserved_position_keeps_intercept_bit_identical():
    s = _random_stats(seed=2, empty=(3, 6))
    assert s.n[3] == 0 and s.n[6] == 0
    ints0 = np.array([0.1, -0.3, 0.7, 0.123456789012345, 2.0, -1.0, -0.0])
    _, ints, ok = shared_slope_step(s, 0.5, ints0, 1e-3, 50.0)
    assert ok
    assert ints[3].tobytes() == ints0[3].tobytes() and ints[6].tobytes() == ints0[6].tobytes()
    assert (ints[[0, 1, 2, 4, 5]] != ints0[[0, 1, 2, 4, 5]]).all()
    slopes, ints_pp, _ = per_position_step(s, np.full(K, 0.5), ints0, 1e-3, 50.0)
    assert ints_pp[3].tobytes() == ints0[3].tobytes() and slopes[6] == 0.5


def test_guard_zeroes_only_the_slope_step():
    s = _random_stats(seed=4)
    s.g0[0] = np.nan  # a NaN slope step: the slope stays, every intercept steps with d_slope = 0
    slope, ints, ok = shared_slope_step(s, 0.5, np.zeros(K), 1e-3, 50.0)
    assert (slope, ok) == (0.5, False)
    np.testing.assert_allclose(ints, s.g1 / (s.c + 1e-3) * s.n / (s.n + 50), rtol=1e-12)
    rng = np.random.default_rng(5)
    f = rng.normal(0, 2, 5000)
    pos = rng.integers(0, K, 5000)
    y = (rng.uniform(size=5000) < 1 / (1 + np.exp(2 * f))).astype(float)  # acceptance falls with f
    est = make_estimator("online_logistic", k=K)
    est.accumulate(f, pos, est.predict(f, pos), y)
    before = est.coefficients()
    assert est.refit() is False and est.rejected == 1
    assert est.slope == before[0] and (est.intercepts != before[1:]).all()


def test_batch_fit_matches_statsmodels_glm(observed):
    import statsmodels.api as sm  # lazy: heavy, imported by the tests that use it
    f, pos, y = observed.features["logit_qmax"], observed.positions, observed.labels
    est = make_estimator("batch_logistic", k=K, config=EstimatorConfig(ridge=0.0))
    est.fit(f, pos, y, tol=1e-12)
    design = np.column_stack([f, np.eye(K)[pos]])  # feature column + one-hot positions
    glm = sm.GLM(y, design, family=sm.families.Binomial()).fit(tol=1e-12)
    np.testing.assert_allclose(est.coefficients(), glm.params, atol=1e-6, rtol=0)


def test_per_position_batch_fit_matches_statsmodels_glm(observed):
    import statsmodels.api as sm  # lazy: heavy, imported by the tests that use it
    f, pos, y = observed.features["logit_qmax"], observed.positions, observed.labels
    est = make_estimator("per_position_slope", k=K, config=EstimatorConfig(ridge=0.0))
    est.fit(f, pos, y, tol=1e-12)
    onehot = np.eye(K)[pos]
    glm = sm.GLM(y, np.column_stack([onehot * f[:, None], onehot]), family=sm.families.Binomial()).fit(tol=1e-12)
    np.testing.assert_allclose(est.coefficients(), glm.params, atol=1e-6, rtol=0)


def test_online_replay_recovers_truth(tmp_path):
    # 300k slots = 54 rounds of 100 engine steps. Each refit is one Newton step from one round's
    # ~2.5k labels, so single rounds are noisy (slope sd ~0.05); the mean over the second half of
    # the trajectory is within 0.007 (slope) / 0.08 (intercepts) of the truth over seeds 0-4.
    # Margins below are ~4x those.
    cfg = SyntheticConfig(num_slots=300_000, seed=0)
    data = load_fit_data([write_synthetic_trace(tmp_path / "t.parquet", cfg)])
    est = make_estimator("online_logistic", k=K)
    _, rows = online_replay(est, data, data.features["logit_qmax"])
    half = pl.DataFrame(rows).tail(len(rows) // 2)
    assert half["slope"].mean() == pytest.approx(cfg.slope, abs=0.03)
    for i, b in enumerate(cfg.intercepts):
        assert half[f"intercept_{i}"].mean() == pytest.approx(b, abs=0.3 if i == K - 1 else 0.15), i
    full = data.step_bounds[len(rows) * 100]  # the trailing partial round is never refitted
    assert est.observations.sum() == full and len(rows) == data.step_file.size // 100


def test_update_refits_every_refit_interval_steps():
    est = make_estimator("online_logistic", k=3, config=EstimatorConfig(refit_interval=4))
    rng = np.random.default_rng(0)
    done = []
    for _ in range(12):
        f, pos = rng.normal(size=5), rng.integers(0, 3, 5)
        done.append(est.update(f, pos, est.predict(f, pos), rng.integers(0, 2, 5)))
    assert done == [False, False, False, True] * 3 and est.rounds == 3


# ---- every registered estimator honours the protocol ----

@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_protocol(name):
    est = make_estimator(name, k=4)
    rng = np.random.default_rng(1)
    f = rng.uniform(0.05, 0.95, 50)  # valid for logistic features and no-fit probabilities
    pos = rng.integers(0, 4, 50)
    p = est.predict(f, pos)
    assert p.shape == (50,) and ((p >= 0) & (p <= 1)).all()
    for _ in range(3):
        assert isinstance(est.update(f, pos, p, (rng.uniform(size=50) < p).astype(float)), bool)
    clone = make_estimator(name, k=4)
    clone.load_state_dict(est.state_dict())
    np.testing.assert_array_equal(clone.predict(f, pos), est.predict(f, pos))
    assert isinstance(est.lossless, bool)
    with pytest.raises(DataError, match="positions"):
        est.predict(f, np.full(50, 4))


def test_lossy_feature_makes_estimator_lossy():
    assert make_estimator("online_logistic", config=EstimatorConfig(feature="logit_q_sampled")).lossless is False
    assert make_estimator("online_logistic").lossless is True


def test_entropy_is_oriented_inside_the_estimator():
    est = make_estimator("online_logistic", k=2, config=EstimatorConfig(feature="entropy"))
    p = est.predict(np.array([0.1, 2.0]), np.array([0, 0]))
    assert est.sign == -1.0 and p[0] > p[1]  # more entropy, less confidence, with slope >= 0


def test_state_of_another_feature_is_refused():
    est = make_estimator("online_logistic", k=3)
    state = make_estimator("online_logistic", k=3, config=EstimatorConfig(feature="entropy")).state_dict()
    with pytest.raises(DataError, match="fitted on feature 'entropy'"):
        est.load_state_dict(state)



def test_replay_order_is_engine_step_order_per_file(tmp_path):
    table = synthetic_trace(SyntheticConfig(num_slots=7000, seed=8))
    shuffled = table.take(np.random.default_rng(0).permutation(table.num_rows))
    pq.write_table(table, tmp_path / "a.parquet")
    pq.write_table(shuffled, tmp_path / "b.parquet")
    data = load_fit_data([tmp_path / "b.parquet", tmp_path / "a.parquet"])
    assert (np.diff(data.row_step) >= 0).all() and data.step_file[data.row_step[0]] == 0
    steps = -(-(7000 // K) // 8)  # engine steps of one file (8 requests a step)
    assert data.step_file.tolist() == [0] * steps + [1] * steps  # each file its own run
    assert data.step_clock.tolist() == list(range(steps)) * 2 and data.clock == "engine_step"
