"""bench/recalibration.py (the bench's blend and online Platt layer) against independent oracles: the Platt fit
against scikit-learn (no prior) and scipy's L-BFGS-B (with the prior), the online layer against a brute-force
loop that refits on every earlier round's slots, and the blend against its formula.
The module is loaded from its file: bench/ is not a package."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_SPEC = importlib.util.spec_from_file_location("recalibration", Path(__file__).parents[1] / "bench/recalibration.py")
rc = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(rc)


def _data(n: int = 4000, seed: int = 0, a: float = 0.7, b: float = 0.3):
    """[n] base predictions and labels drawn from sigmoid(a logit(p) + b): a miscalibrated base."""
    rng = np.random.default_rng(seed)
    p = 1.0 / (1.0 + np.exp(-rng.normal(1.0, 1.5, n)))
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(a * rc.logit(p) + b)))).astype(np.float64)
    return p, y


def test_platt_fit_matches_sklearn():
    from sklearn.linear_model import LogisticRegression

    p, y = _data()
    ref = LogisticRegression(C=np.inf, solver="newton-cholesky", tol=1e-12, max_iter=1000)
    ref.fit(rc.logit(p)[:, None], y)
    np.testing.assert_allclose(rc.platt_fit(rc.logit(p), y), [ref.coef_[0, 0], ref.intercept_[0]], atol=1e-8)
    a, b = rc.platt_fit(rc.logit(p), y)
    assert abs(a - 0.7) < 0.1 and abs(b - 0.3) < 0.1  # 4,000 slots: the drawn model within its sampling error


@pytest.mark.parametrize("lam", [10.0, 1000.0])
def test_platt_prior_matches_scipy(lam):
    from scipy.optimize import minimize

    p, y = _data(800, seed=1)
    z = rc.logit(p)

    def loss(theta):
        s = theta[0] * z + theta[1]
        return np.logaddexp(0.0, s).sum() - y @ s + lam / 2 * ((theta[0] - 1.0) ** 2 + theta[1] ** 2)

    ref = minimize(loss, np.array([1.0, 0.0]), method="L-BFGS-B", options={"gtol": 1e-10, "ftol": 1e-15})
    np.testing.assert_allclose(rc.platt_fit(z, y, lam), ref.x, atol=1e-5)


def test_online_platt_tracks_the_refit_on_earlier_rounds():
    """The one-step filter against the exact MAP refit on every earlier round (a brute-force loop), 3,000 slots
    in 10 rounds: within 0.025 on every prediction, within 0.006 from the seventh round on (it lags the refit
    by a shrinking step)."""
    p, y = _data(3000, seed=2)
    steps = np.sort(np.random.default_rng(3).integers(0, 100, p.size))  # [N] engine step of each slot
    out = rc.online_platt(p, y, steps, lam=20.0, every=10)
    expected = np.empty_like(p)
    for i in range(p.size):  # brute force: each slot through the map fitted on every slot of an earlier round
        past = steps // 10 < steps[i] // 10
        a, b = rc.platt_fit(rc.logit(p[past]), y[past], 20.0)
        expected[i] = 1.0 / (1.0 + np.exp(-(a * rc.logit(p[i]) + b)))
    gap = np.abs(out - expected)  # measured: 0.017 after the first round, falling to 0.003 by the tenth
    assert gap.max() < 0.025 and gap[steps >= 60].max() < 0.006
    first = steps < 10
    np.testing.assert_allclose(out[first], p[first], atol=1e-9)  # nothing learned before the first round ends


def test_online_platt_never_reads_a_label_early():
    p, y = _data(500, seed=4)
    steps = np.arange(p.size) // 5  # [N]
    flipped = y.copy()
    flipped[300:] = 1.0 - flipped[300:]  # labels from engine step 60 on
    a, b = (rc.online_platt(p, lab, steps, lam=5.0, every=10) for lab in (y, flipped))
    np.testing.assert_array_equal(a[:300], b[:300])
    assert not np.allclose(a[350:], b[350:])


def test_infinite_prior_and_blend_endpoints():
    p, y = _data(300, seed=5)
    q = np.clip(p[::-1] * 0.9, 0.01, 0.99)
    np.testing.assert_allclose(rc.online_platt(p, y, np.arange(p.size), np.inf), p, atol=1e-9)
    np.testing.assert_allclose(rc.blend(p, q, 1.0), p, atol=1e-9)
    np.testing.assert_allclose(rc.blend(p, q, 0.0), q, atol=1e-9)
    z = 0.25 * np.log(p / (1 - p)) + 0.75 * np.log(q / (1 - q))
    np.testing.assert_allclose(rc.blend(p, q, 0.25), 1.0 / (1.0 + np.exp(-z)), atol=1e-12)
