"""The online Platt map (avkit/estimators/platt.py) and bench/recalibration.py's batch Platt fit against
independent oracles: the fit against scikit-learn (no prior) and scipy's L-BFGS-B (with the prior), the online
map against a brute-force loop that refits on every earlier round's slots, the blend against its formula, and
`forgetting_platt` against forgetting_logistic's replay through the map. The bench module is loaded from its
file: bench/ is not a package."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from avkit.estimators.platt import blend, logit, online_platt

_SPEC = importlib.util.spec_from_file_location("recalibration", Path(__file__).parents[1] / "bench/recalibration.py")
rc = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(rc)


def _data(n: int = 4000, seed: int = 0, a: float = 0.7, b: float = 0.3):
    """[n] base predictions and labels drawn from sigmoid(a logit(p) + b): a miscalibrated base."""
    rng = np.random.default_rng(seed)
    p = 1.0 / (1.0 + np.exp(-rng.normal(1.0, 1.5, n)))
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(a * logit(p) + b)))).astype(np.float64)
    return p, y


def test_platt_fit_matches_sklearn():
    from sklearn.linear_model import LogisticRegression

    p, y = _data()
    ref = LogisticRegression(C=np.inf, solver="newton-cholesky", tol=1e-12, max_iter=1000)
    ref.fit(logit(p)[:, None], y)
    np.testing.assert_allclose(rc.platt_fit(logit(p), y), [ref.coef_[0, 0], ref.intercept_[0]], atol=1e-8)
    a, b = rc.platt_fit(logit(p), y)
    assert abs(a - 0.7) < 0.1 and abs(b - 0.3) < 0.1  # 4,000 slots: the drawn model within its sampling error


@pytest.mark.parametrize("lam", [10.0, 1000.0])
def test_platt_prior_matches_scipy(lam):
    from scipy.optimize import minimize

    p, y = _data(800, seed=1)
    z = logit(p)

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
    out = online_platt(p, y, steps, prior=20.0, every=10)
    expected = np.empty_like(p)
    for i in range(p.size):  # brute force: each slot through the map fitted on every slot of an earlier round
        past = steps // 10 < steps[i] // 10
        a, b = rc.platt_fit(logit(p[past]), y[past], 20.0)
        expected[i] = 1.0 / (1.0 + np.exp(-(a * logit(p[i]) + b)))
    gap = np.abs(out - expected)  # measured: 0.017 after the first round, falling to 0.003 by the tenth
    assert gap.max() < 0.025 and gap[steps >= 60].max() < 0.006
    first = steps < 10
    np.testing.assert_allclose(out[first], p[first], atol=1e-9)  # nothing learned before the first round ends


def test_online_platt_round_is_the_exact_map_on_confident_logits():
    """Confident base logits (z ~ 7-14, as forgetting_gap's at T = 0.3), labels drawn from sigmoid(0.9 z - 6): after the
    first round the map is the exact MAP fit of that round under its prior (scipy's L-BFGS-B on the penalised
    log-likelihood, an independent oracle), and later predictions stay within 0.01 of the brute-force refit on
    every earlier round. A single Newton step from the identity at prior 10 lands at a = -16.6 (measured), the
    round's MAP at 0.29."""
    from scipy.optimize import minimize

    from avkit.estimators.platt import PlattMap

    rng = np.random.default_rng(7)
    z = rng.uniform(7.0, 14.0, 3000)  # [N]
    y = (rng.random(z.size) < 1.0 / (1.0 + np.exp(-(0.9 * z - 6.0)))).astype(np.float64)
    steps = np.sort(rng.integers(0, 100, z.size))  # [N]
    first = steps < 10

    def loss(theta):
        s = theta[0] * z[first] + theta[1]
        return np.logaddexp(0.0, s).sum() - y[first] @ s + 10.0 / 2 * ((theta[0] - 1.0) ** 2 + theta[1] ** 2)

    ref = minimize(loss, np.array([1.0, 0.0]), method="L-BFGS-B", options={"gtol": 1e-10, "ftol": 1e-15}).x
    m = PlattMap(10.0)
    m.add(z[first], y[first])
    m.step()
    np.testing.assert_allclose(m.theta, ref, atol=1e-4)
    p = 1.0 / (1.0 + np.exp(-z))
    out = online_platt(p, y, steps, prior=10.0, every=10)
    later = steps >= 30
    expected = np.empty(later.sum())
    for j, i in enumerate(np.flatnonzero(later)):
        past = steps // 10 < steps[i] // 10
        a, b = rc.platt_fit(logit(p[past]), y[past], 10.0)
        expected[j] = 1.0 / (1.0 + np.exp(-(a * logit(p[i]) + b)))
    assert np.abs(out[later] - expected).max() < 0.01


def test_online_platt_never_reads_a_label_early():
    p, y = _data(500, seed=4)
    steps = np.arange(p.size) // 5  # [N]
    flipped = y.copy()
    flipped[300:] = 1.0 - flipped[300:]  # labels from engine step 60 on
    a, b = (online_platt(p, lab, steps, prior=5.0, every=10) for lab in (y, flipped))
    np.testing.assert_array_equal(a[:300], b[:300])
    assert not np.allclose(a[350:], b[350:])


def test_infinite_prior_and_blend_endpoints():
    p, y = _data(300, seed=5)
    q = np.clip(p[::-1] * 0.9, 0.01, 0.99)
    np.testing.assert_allclose(online_platt(p, y, np.arange(p.size), np.inf), p, atol=1e-9)
    np.testing.assert_allclose(blend(p, q, 1.0), p, atol=1e-9)
    np.testing.assert_allclose(blend(p, q, 0.0), q, atol=1e-9)
    z = 0.25 * np.log(p / (1 - p)) + 0.75 * np.log(q / (1 - q))
    np.testing.assert_allclose(blend(p, q, 0.25), 1.0 / (1.0 + np.exp(-z)), atol=1e-12)


def _steps(n_steps: int = 400, seed: int = 6, k: int = 7):
    """[N] feature, position, label of `n_steps` engine steps of K slots, and [G + 1] step bounds: acceptance
    sigmoid(1.3 f - 0.5), which forgetting_logistic's start (slope 0.5) miscalibrates."""
    rng = np.random.default_rng(seed)
    f = rng.normal(1.0, 1.5, n_steps * k)
    y = (rng.random(f.size) < 1.0 / (1.0 + np.exp(-(1.3 * f - 0.5)))).astype(np.float64)
    return f, np.tile(np.arange(k), n_steps), y, np.arange(n_steps + 1) * k


@pytest.mark.parametrize("prior", [10.0, 1000.0, np.inf])
def test_forgetting_platt_is_forgetting_logistic_through_the_online_map(prior):
    """Replayed as live, the estimator's predictions are forgetting_logistic's replay through `online_platt`
    (the base refits on its own predictions, never the map's): one implementation, two callers."""
    from avkit.config import PlattConfig
    from avkit.estimators import make_estimator
    from avkit.estimators.rounds import replay_steps

    f, pos, y, bounds = _steps()
    est = make_estimator("forgetting_platt", k=7, platt=PlattConfig(prior=prior))
    got = replay_steps(est, f, pos, y, bounds)
    base = replay_steps(make_estimator("forgetting_logistic", k=7), f, pos, y, bounds)
    np.testing.assert_allclose(got, online_platt(base, y, np.repeat(np.arange(400), 7), prior), atol=1e-12)
    assert (est.map.theta[0] > 1.0) == np.isfinite(prior)  # the map steepens the under-confident base


def test_forgetting_platt_state_survives_its_coefficients_file(tmp_path):
    """state_dict -> coefficients document -> the validated loader -> a new estimator predicts the same, on the
    host and on the device path; a file without a map warm-starts the base with the identity map."""
    import json

    import torch

    from avkit.estimators import make_estimator
    from avkit.estimators.coefficients import coefficients_document, load_estimator
    from avkit.estimators.rounds import replay_steps

    f, pos, y, bounds = _steps(200)
    est = make_estimator("forgetting_platt", k=7)
    replay_steps(est, f, pos, y, bounds)
    path = tmp_path / "coefficients.json"
    path.write_text(json.dumps(coefficients_document(est, {})))
    back = load_estimator("forgetting_platt", path, k=7)
    np.testing.assert_array_equal(back.predict(f, pos), est.predict(f, pos))
    np.testing.assert_allclose(back.predict_torch(torch.from_numpy(f), torch.from_numpy(pos)).numpy(),
                               est.predict(f, pos), atol=1e-12)
    base = make_estimator("forgetting_logistic", k=7)
    base.load_state_dict(est.state_dict())
    plain = make_estimator("forgetting_platt", k=7)
    plain.load_state_dict(base.state_dict())
    np.testing.assert_allclose(plain.predict(f, pos), base.predict(f, pos), atol=1e-15)
    bad = json.loads(path.read_text()) | {"platt": {"a": 1.0, "b": "x", "precision": [[1, 0], [0, 1]]}}
    path.write_text(json.dumps(bad))
    from avkit.errors import ConfigError

    with pytest.raises(ConfigError, match="platt.b"):
        load_estimator("forgetting_platt", path, k=7)



def test_forgetting_platt_refits_live_in_the_adaptive_policy():
    """The live path (adaptive policy, one engine step per `observe`) steps the map every `every` steps."""
    import torch

    from avkit.scheduling.adaptive import make_adaptive
    from avkit.step_types import VerifyOutcome

    policy = make_adaptive(cost="roofline:cpu:1.5b", estimator="forgetting_platt", k=7)
    est, rng = policy.estimator, np.random.default_rng(3)
    for _ in range(est.platt.every):
        f = torch.tensor(rng.normal(2, 2, (4, 7)), dtype=torch.float32)
        conf = torch.from_numpy(est.predict(f.numpy().ravel(), np.tile(np.arange(7), 4)).reshape(4, 7))
        policy.observe(VerifyOutcome({"logit_qmax": f}, conf, torch.full((4,), 7), torch.tensor([7, 2, 0, 5])))
    assert est.name == "forgetting_platt" and not np.array_equal(est.map.theta, [1.0, 0.0])
