"""bench/multi_logistic.py (the bench's online_multi and online_shift model) against independent oracles: its
batch fit against scikit-learn (no priors) and scipy's L-BFGS-B (both priors and the shared shift), one online
round against a dense Newton step built from the design matrix, and an infinite prior freezing what it names.
The module is loaded from its file: bench/ is not a package."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from avkit.estimators.base import sigmoid

_SPEC = importlib.util.spec_from_file_location("multi_logistic", Path(__file__).parents[1] / "bench/multi_logistic.py")
ml = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ml)
K = 7


def _data(n: int = 8000, seed: int = 0):
    """[n, 3] features, [n] positions, [n] labels drawn from a known three-feature model."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    pos = rng.integers(0, K, n)
    y = (rng.random(n) < sigmoid(x @ [1.0, 0.5, -0.3] + 0.2 * pos - 0.5)).astype(np.float64)
    return x, pos, y


def test_batch_fit_matches_sklearn():
    assert ml.sklearn_gap(*_data()) < 1e-8


@pytest.mark.parametrize("shrink, offsets", [(100.0, 10.0), (0.0, 1.0), (1000.0, 1000.0)])
def test_penalised_fit_matches_scipy(shrink, offsets):
    assert ml.penalised_gap(*_data(), shrink=shrink, offsets=offsets) < 1e-5


def test_round_is_one_dense_newton_step():
    """Undamped, one round's step equals solve(D^T W D + diag(prior + ridge), D^T (y - p) - prior (theta -
    centre)) on the dense design D = [x, 1, one-hot position]: the arrowhead elimination is exact."""
    x, pos, y = _data(600, seed=1)
    est = ml.MultiLogistic(K, shrink=50.0, offsets=5.0)
    est.load_state_dict({"weights": [0.8, 0.1, 0.0], "intercepts": np.linspace(-0.5, 0.5, K).tolist(),
                         "num_positions": K})
    est.weights[-1], est.intercepts = 0.2, est.intercepts + 0.1 * np.arange(K)  # off the priors' centres
    theta = np.r_[est.weights, est.intercepts]
    centre = np.r_[est.start, est.origin]
    prior = np.r_[[50.0] * 3, 0.0, [5.0] * K]  # the shared shift is free
    dense = np.c_[x, np.ones(len(x)), np.eye(K)[pos]]  # [n, 3 + 1 + K]
    p = sigmoid(dense @ theta)
    hess = dense.T @ (dense * (p * (1 - p))[:, None]) + np.diag(prior + est.config.ridge)
    step = np.linalg.solve(hess, dense.T @ (y - p) - prior * (theta - centre))

    est.accumulate(x, pos, p, y)
    est._step(None, 0.0)
    np.testing.assert_allclose(np.r_[est.weights, est.intercepts] - theta, step, atol=1e-10)


def test_infinite_priors_freeze_what_they_name():
    x, pos, y = _data(3000, seed=2)
    est = ml.MultiLogistic(K, shrink=np.inf, offsets=np.inf)
    est.load_state_dict({"weights": [0.8, 0.1, 0.0], "intercepts": [-0.2] * K, "num_positions": K})
    for chunk in np.array_split(np.arange(len(y)), 10):
        est.accumulate(x[chunk], pos[chunk], est.predict(x[chunk], pos[chunk]), y[chunk])
        est.refit()
    assert est.weights[:3].tolist() == [0.8, 0.1, 0.0] and est.intercepts.tolist() == [-0.2] * K
    assert abs(est.weights[3]) > 0.05  # the shared shift learned the data's level (true mean logit ~ +0.1)
