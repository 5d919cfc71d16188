"""Budgeted verification (avkit/scheduling/budget.py) against a brute-force oracle."""

import itertools

import numpy as np
import pytest
import torch

from avkit.scheduling.budget import plan_verification, survival


def _brute_force(conf, drafted, n_s, t, fixed_ms, verify_ms):
    """Best E/cost over every prefix allocation k_r in 0..drafted_r (exhaustive)."""
    best = -1.0
    for ks in itertools.product(*[range(d + 1) for d in drafted]):
        expected = n_s + sum(np.prod(conf[r, : j + 1]) for r, k in enumerate(ks) for j in range(k))
        rate = expected / (fixed_ms + verify_ms(np.array([t + sum(ks)]))[0])
        best = max(best, rate)
    return best


def _random_cost(rng):
    """A random non-decreasing verify curve: flat while memory-bound, then linear, plus jitter steps."""
    knee, slope, base = rng.integers(0, 8), rng.uniform(0, 2.0), rng.uniform(0.5, 5)
    steps = np.maximum.accumulate(rng.uniform(0, 0.3, 64))
    return lambda tok: base + slope * np.maximum(np.asarray(tok) - knee, 0) + steps[np.minimum(tok, 63)]


@pytest.mark.parametrize("seed", range(40))
def test_budget_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    b, k = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    conf = rng.uniform(0, 1, (b, k)) ** rng.uniform(0.2, 2)
    drafted = rng.integers(0, k + 1, b)
    n_s, t, fixed = int(rng.integers(0, b + 1)), int(rng.integers(0, 4)), float(rng.uniform(0, 3))
    cost = _random_cost(rng)
    plan = plan_verification(torch.tensor(conf), torch.tensor(drafted), num_sampling=n_s, num_scheduled=t,
                             fixed_ms=fixed, verify_ms=cost)
    oracle = _brute_force(conf, drafted, n_s, t, fixed, cost)
    assert plan.expected_tokens / plan.cost_ms == pytest.approx(oracle, rel=1e-9, abs=1e-12)
    nv = plan.num_verify.numpy()
    assert (nv <= drafted).all() and nv.sum() == plan.budget <= drafted.sum()


def test_budget_ties_pick_smallest():
    # conf 0 everywhere, flat cost: every b has the same rate -> verify nothing
    plan = plan_verification(torch.zeros(3, 4), torch.tensor([4, 4, 4]), num_sampling=3, num_scheduled=3,
                             fixed_ms=1.0, verify_ms=lambda t: np.ones_like(t, dtype=float))
    assert plan.budget == 0


@pytest.mark.parametrize("seed", range(10))
def test_allocations_are_prefixes_of_top_survivals(seed):
    g = torch.Generator().manual_seed(seed)
    conf = torch.rand(16, 7, generator=g)
    drafted = torch.randint(0, 8, (16,), generator=g)
    plan = plan_verification(conf, drafted, num_sampling=16, num_scheduled=16, fixed_ms=2.0,
                             verify_ms=lambda t: 1.0 + 0.05 * t)
    surv = plan.survival
    kept = torch.arange(7)[None, :] < plan.num_verify[:, None]  # the prefix masks
    valid = torch.arange(7)[None, :] < drafted[:, None]
    assert (plan.num_verify <= drafted).all()
    if kept.any() and (valid & ~kept).any():  # every kept slot's survival >= every dropped valid slot's
        assert surv[kept].min() >= surv[valid & ~kept].max()


def test_confident_flat_cost_verifies_everything():
    drafted = torch.tensor([7, 3, 0, 5])
    plan = plan_verification(torch.ones(4, 7), drafted, num_sampling=4, num_scheduled=4, fixed_ms=5.0,
                             verify_ms=lambda t: np.full(np.shape(t), 10.0))
    assert plan.num_verify.tolist() == drafted.tolist()


def test_steep_cost_verifies_nothing():
    plan = plan_verification(torch.full((8, 7), 0.9), torch.full((8,), 7), num_sampling=8, num_scheduled=8,
                             fixed_ms=0.0, verify_ms=lambda t: np.exp(np.asarray(t, dtype=float)))
    assert plan.num_verify.tolist() == [0] * 8


def test_confident_request_outlasts_doubtful_one():
    conf = torch.tensor([[0.99] * 6, [0.5] * 6])
    plan = plan_verification(conf, torch.tensor([6, 6]), num_sampling=2, num_scheduled=2, fixed_ms=1.0,
                             verify_ms=lambda t: 1.0 + 0.1 * np.asarray(t))
    assert plan.num_verify[0] > plan.num_verify[1] >= 0


def test_survival_masks_undrafted_slots():
    s = survival(torch.tensor([[0.5, 0.5, 0.5], [1.0, 0.2, 1.0]]), torch.tensor([2, 3]))
    torch.testing.assert_close(s, torch.tensor([[0.5, 0.25, 0.0], [1.0, 0.2, 0.2]]))
