"""The verification plan (avkit/scheduling/plan.py) against brute-force oracles: every prefix allocation
of one step enumerated, and many groups planned at once equal to a loop planning each group alone."""

import itertools

import numpy as np
import pytest
import torch

from avkit.scheduling.plan import plan, single_group, survival, verify_lookup


def plan_verification(conf, drafted, *, num_sampling, num_scheduled, fixed_ms, verify_ms, sizing=None):
    """One step (one group) planned with a cost function tabulated over every token count it can reach."""
    b, k = conf.shape
    table = verify_lookup(verify_ms, num_scheduled + b * k + 1)
    return plan(conf, drafted, single_group(b), 1, num_sampling=torch.tensor([num_sampling]),
                num_scheduled=torch.tensor([num_scheduled]), fixed_ms=torch.tensor([float(fixed_ms)], dtype=torch.float64),
                verify_ms=table, sizing=sizing)


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
    assert float(plan.expected[0] / plan.cost_ms[0]) == pytest.approx(oracle, rel=1e-9, abs=1e-12)
    nv = plan.num_verify.numpy()
    assert (nv <= drafted).all() and nv.sum() == int(plan.budget[0]) <= drafted.sum()


def test_budget_ties_pick_smallest():
    # conf 0 everywhere, flat cost: every b has the same rate -> verify nothing
    plan = plan_verification(torch.zeros(3, 4), torch.tensor([4, 4, 4]), num_sampling=3, num_scheduled=3,
                             fixed_ms=1.0, verify_ms=lambda t: np.ones_like(t, dtype=float))
    assert int(plan.budget[0]) == 0


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


@pytest.mark.parametrize("sized", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_groups_equal_a_loop_over_groups(seed, sized):
    """Thousands of simulated steps at once (a `group` vector) decide exactly as planning each step alone,
    with and without separate sizing inputs; ties (rounded confidences) and empty groups included."""
    rng = np.random.default_rng(seed)
    g_count, k = 40, 5
    sizes = rng.integers(1, 7, g_count)
    group = np.repeat(np.arange(g_count), sizes)
    conf = np.round(rng.uniform(0.0, 1.0, (group.size, k)), 1)  # many ties
    drafted = rng.integers(0, k + 1, group.size)
    size_conf = rng.uniform(0.2, 1.0, (group.size, k))
    nominal = np.where(drafted > 0, k, 0)
    n = sizes.astype(np.int64)
    fixed = rng.uniform(0.0, 3.0, g_count)
    cost = _random_cost(rng)
    table = verify_lookup(cost, int(n.max()) * (k + 1) + 1)
    t = torch.from_numpy
    sizing = (t(size_conf), t(nominal)) if sized else None
    got = plan(t(conf), t(drafted), t(group), g_count, num_sampling=t(n), num_scheduled=t(n), fixed_ms=t(fixed),
               verify_ms=table, sizing=sizing)
    for g in range(g_count):
        m = group == g
        one = plan_verification(t(conf[m]), t(drafted[m]), num_sampling=int(n[g]), num_scheduled=int(n[g]),
                                fixed_ms=fixed[g], verify_ms=cost,
                                sizing=(t(size_conf[m]), t(nominal[m])) if sized else None)
        assert one.num_verify.tolist() == got.num_verify[t(m)].tolist(), g
        assert int(one.budget[0]) == int(got.budget[g])
        # E(b*) sums one running total across groups: equal to a few ulps (the decisions above exactly)
        assert float(one.expected[0]) == pytest.approx(float(got.expected[g]), rel=1e-12)
        assert float(one.cost_ms[0]) == float(got.cost_ms[g])


def test_survival_is_the_kernels_left_to_right_float32_product():
    """float32 survival is the sequential product (the Triton survival kernel's order), not a float64
    accumulation rounded once; float64 input stays float64 (the simulator's estimators)."""
    g = torch.Generator().manual_seed(0)
    c = torch.rand(64, 7, generator=g)
    s = survival(c, torch.full((64,), 7))
    want = c.clone()
    for j in range(1, 7):
        want[:, j] = want[:, j - 1] * c[:, j]
    assert s.dtype == torch.float32 and torch.equal(s, want)
    want64 = c.double()
    for j in range(1, 7):
        want64[:, j] = want64[:, j - 1] * want64[:, j]
    assert torch.equal(survival(c.double(), torch.full((64,), 7)), want64)  # the scan, in order
