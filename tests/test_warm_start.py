"""The temperature warm start (avkit/estimators/warm_start.py): at a recorded temperature it is that
temperature's maximum-likelihood fit (statsmodels as the oracle), away from every recorded temperature
it shrinks toward vLLM's constants by exp(-gap / tau), and it loads into the online estimators."""

import itertools
import json
import math

import numpy as np
import pytest

from avkit.config import EstimatorConfig
from avkit.errors import ConfigError
from avkit.estimators import make_estimator
from avkit.estimators.coefficients import load_estimator
from avkit.estimators.warm_start import TemperatureFit, shrink_weight, temperature_warm_start

K = 3


def _slots(seed: int, slope: float, intercepts, n: int = 6000):
    """[n] feature, position, label drawn from sigma(slope * f + intercept_pos) (seeded)."""
    rng = np.random.default_rng(seed)
    f, pos = rng.normal(3.0, 2.0, n), rng.integers(0, K, n)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(slope * f + np.asarray(intercepts)[pos])))).astype(float)
    return f, pos, y


def _fit(f, pos, y) -> dict:
    est = make_estimator("batch_logistic", k=K, config=EstimatorConfig(ridge=0.0))
    est.fit(f, pos, y, tol=1e-12)
    return est.state_dict()


@pytest.fixture(scope="module")
def fits():
    """Fits at T = 0.2 (slope 0.4) and T = 1 (slope 0.9) of seeded synthetic slots, with statsmodels' MLE."""
    import statsmodels.api as sm  # lazy: heavy, imported by the tests that use it

    out = []
    for seed, temperature, slope, ints in ((1, 0.2, 0.4, [-1.0, -0.8, -0.5]), (2, 1.0, 0.9, [0.3, 0.5, 0.6])):
        f, pos, y = _slots(seed, slope, ints)
        glm = sm.GLM(y, np.column_stack([f, np.eye(K)[pos]]), family=sm.families.Binomial()).fit(tol=1e-12)
        out.append((TemperatureFit(temperature, _fit(f, pos, y)), glm.params))  # params: [slope, b_0..b_K-1]
    return out


def _coef(state: dict) -> np.ndarray:
    return np.r_[state["slope"], state["intercepts"]]


@pytest.mark.parametrize("tau", [0.0, 0.1, math.inf])
def test_at_a_recorded_temperature_the_start_is_its_mle(fits, tau):
    for fit, mle in fits:
        state = temperature_warm_start([f for f, _ in fits], fit.temperature, tau)
        assert _coef(state).tolist() == _coef(fit.state).tolist()  # bit-identical, whatever tau
        np.testing.assert_allclose(_coef(state), mle, atol=1e-6, rtol=0)  # the oracle's fit


def test_away_from_every_temperature_it_shrinks_toward_the_constants(fits):
    ref = np.r_[0.5, [-0.2] * K]  # EstimatorConfig's init_slope / init_intercept: vLLM's constants
    only = [fits[1][0]]  # T = 1 alone: T = 0.6 is 0.4 away
    np.testing.assert_array_equal(_coef(temperature_warm_start(only, 0.6, 0.0)), ref)
    np.testing.assert_array_equal(_coef(temperature_warm_start(only, 0.6, math.inf)), _coef(only[0].state))
    lam = math.exp(-0.4 / 0.25)
    np.testing.assert_allclose(_coef(temperature_warm_start(only, 0.6, 0.25)),
                               lam * fits[1][1] + (1 - lam) * ref, atol=1e-6, rtol=0)
    # the start moves monotonically from the fit to the constants as the gap grows
    dist = [np.abs(_coef(temperature_warm_start(only, t, 0.3)) - ref).sum() for t in (1.0, 0.9, 0.7, 0.4, 0.0)]
    assert all(a > b for a, b in itertools.pairwise(dist))


def test_the_nearest_temperature_wins_and_ties_weigh_by_observations(fits):
    (low, _), (high, _) = fits
    near_low = temperature_warm_start([low, high], 0.3, math.inf)
    np.testing.assert_array_equal(_coef(near_low), _coef(low.state))
    tie = temperature_warm_start([low, high], 0.6, math.inf)  # 0.4 from both
    w = np.array([sum(low.state["observations"]), sum(high.state["observations"])], dtype=float)
    w /= w.sum()
    np.testing.assert_allclose(_coef(tie), w[0] * _coef(low.state) + w[1] * _coef(high.state), rtol=1e-12)


@pytest.mark.parametrize("name", ["online_logistic", "forgetting_logistic"])
def test_the_start_loads_into_the_online_estimators(fits, name):
    state = temperature_warm_start([f for f, _ in fits], 0.5, 0.2)
    est = make_estimator(name, k=K)
    est.load_state_dict(state)
    f, pos = np.array([0.0, 2.0, 5.0]), np.array([0, 1, 2])
    expected = 1 / (1 + np.exp(-(state["slope"] * f + np.asarray(state["intercepts"])[pos])))
    np.testing.assert_allclose(est.predict(f, pos), expected, rtol=1e-12)
    assert est.rounds == 0  # young again: the start's curvature is not carried over


def test_shrink_weight_edges():
    assert shrink_weight(0.0, 0.0) == 1.0 and shrink_weight(0.3, 0.0) == 0.0
    assert shrink_weight(0.3, math.inf) == 1.0 and shrink_weight(0.3, 0.3) == pytest.approx(math.exp(-1))


@pytest.mark.parametrize("args, match", [
    (([], 0.3, 0.1), "no fits"),
    (("fits", -0.1, 0.1), "temperature must be"),
    (("fits", 0.3, -1.0), "tau must be"),
    (("fits", 0.3, math.nan), "tau must be"),
])
def test_bad_input_names_what_is_wrong(fits, args, match):
    given = [f for f, _ in fits] if args[0] == "fits" else args[0]
    with pytest.raises(ConfigError, match=match):
        temperature_warm_start(given, *args[1:])


def test_fits_of_another_k_or_feature_are_refused(fits):
    low = fits[0][0]
    other_k = TemperatureFit(1.0, low.state | {"num_positions": K + 1, "intercepts": [0.0] * (K + 1)})
    with pytest.raises(ConfigError, match=r"T=1 has num_positions 4"):
        temperature_warm_start([low, other_k], 0.5, 0.1)
    other_feature = TemperatureFit(1.0, low.state | {"feature": "entropy"})
    with pytest.raises(ConfigError, match="feature 'entropy'"):
        temperature_warm_start([low, other_feature], 0.5, 0.1)


def test_the_start_is_a_coefficients_file_serve_can_load(fits, tmp_path):
    state = temperature_warm_start([f for f, _ in fits], 0.5, 0.2)
    path = tmp_path / "start.json"
    path.write_text(json.dumps(state))
    est = load_estimator("forgetting_logistic", path, k=K)  # the validated loader `avkit serve` uses
    assert est.slope == state["slope"] and est.intercepts.tolist() == state["intercepts"]
