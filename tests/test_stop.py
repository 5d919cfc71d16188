"""The early stop's look-ahead (avkit/scheduling/plan.py): a request drafts on while any deeper depth pays,
checked against brute force: a loop over rows and depths, and the best depth of a staircase step cost."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from avkit.scheduling.plan import continue_drafting, plan, single_group


def _staircase(tile: int, step_ms: float, base_ms: float, top: int) -> torch.Tensor:
    """[top + 1] verify ms by tokens: `base_ms` per started tile of `tile` query rows (the CPU kernel's 6-row tiles)."""
    t = torch.arange(top + 1, dtype=torch.float64)
    return base_ms + step_ms * torch.div(t + tile - 1, tile, rounding_mode="floor").clamp(min=1)


def _loop_oracle(conf, proposed, active, group, inputs, k):
    """The rule by hand, one row and one depth at a time (plan.py's plan for the rate and the budget)."""
    p = plan(conf, proposed, group, int(group.max()) + 1, num_sampling=inputs["num_sampling"],
             num_scheduled=inputs["num_scheduled"], fixed_ms=inputs["fixed_ms"], verify_ms=inputs["verify_ms"])
    out = []
    for r in range(conf.shape[0]):
        g = int(group[r])
        rate = float(p.expected[g] / p.cost_ms[g])
        t = int(inputs["num_scheduled"][g] + p.budget[g])
        j = int(proposed[r]) - 1
        s, c = float(p.survival[r, j]), min(max(float(np.nan_to_num(float(conf[r, j]))), 0.0), 1.0)
        v = int(p.num_verify[r])
        pending = sum(float(p.survival[r, i]) for i in range(v, j + 1))  # drafted, left unverified by b*
        share = float(inputs["pass_ms"][g]) / max(int(inputs["n_active"][g]), 1)
        pays = False
        for m in range(1, k - int(proposed[r]) + 1):
            gain = pending + s * sum(c ** i for i in range(1, m + 1))
            top = len(inputs["verify_ms"]) - 1
            cost = m * share + float(inputs["verify_ms"][min(t + (j + 1 - v) + m, top)] - inputs["verify_ms"][t])
            pays = pays or gain > rate * cost
        out.append(bool(active[r]) and pays)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_look_ahead_is_the_loop_oracle(seed):
    rng = np.random.default_rng(seed)
    k, groups = int(rng.integers(2, 9)), int(rng.integers(1, 5))
    sizes = rng.integers(1, 6, groups)
    group = torch.as_tensor(np.repeat(np.arange(groups), sizes))
    s = int(sizes.sum())
    j = int(rng.integers(1, k))
    proposed = torch.as_tensor(rng.integers(1, j + 1, s))
    conf = torch.as_tensor(rng.uniform(0.2, 1.0, (s, j)))
    conf = conf.masked_fill(torch.arange(j)[None, :] >= proposed[:, None], float("nan"))
    active = proposed == j
    n_active = torch.zeros(groups, dtype=torch.int64).index_add_(0, group, active.long())
    n = torch.as_tensor(sizes)
    inputs = {"num_sampling": n, "num_scheduled": n, "fixed_ms": torch.as_tensor(rng.uniform(1, 30, groups)),
              "pass_ms": torch.as_tensor(rng.uniform(0.5, 20, groups)), "n_active": n_active,
              "verify_ms": _staircase(int(rng.integers(1, 8)), float(rng.uniform(5, 60)), 40.0, s * (k + 1) + 2)}
    keep, _ = continue_drafting(conf, proposed, active, group, groups, max_drafts=k, **inputs)
    assert keep.tolist() == _loop_oracle(conf, proposed, active, group, inputs, k)


def _draft_until_stop(c: float, k: int, pass_ms: float, verify_ms: torch.Tensor, horizon) -> int:
    """One request drafting pass by pass at constant confidence c, paying each pass: the depth it stops at.
    horizon(j): the `max_drafts` given after pass j (k: look ahead to K; j + 1: the one-step rule)."""
    one = torch.ones(1, dtype=torch.int64)
    for j in range(1, k + 1):
        if j == k:
            return k
        keep, _ = continue_drafting(torch.full((1, j), c, dtype=torch.float64), one * j, torch.ones(1, dtype=torch.bool),
                                    single_group(1), 1, num_sampling=one, num_scheduled=one,
                                    fixed_ms=torch.tensor([j * pass_ms], dtype=torch.float64),
                                    pass_ms=torch.tensor([pass_ms], dtype=torch.float64), n_active=one,
                                    verify_ms=verify_ms, max_drafts=horizon(j))
        if not keep.item():
            return j
    return k


def _rate(c: float, d: int, pass_ms: float, verify_ms: torch.Tensor) -> float:
    """Tokens per ms of drafting d and verifying all d (1 + c + ... + c^d tokens expected)."""
    return (1 + sum(c ** i for i in range(1, d + 1))) / (d * pass_ms + float(verify_ms[1 + d]))


@pytest.mark.parametrize("seed", range(6))
def test_look_ahead_stops_at_the_best_depth_of_a_staircase(seed):
    """Brute force over depths: with the confidence known (constant), the look-ahead's depth has the best rate
    of any depth >= 1 on a 6-row-tile staircase; the one-step rule (d + 1 only) stops short on some of them
    and loses."""
    rng = np.random.default_rng(seed)
    k, lost = 12, []
    for _ in range(40):
        c, pass_ms = float(rng.uniform(0.6, 0.99)), float(rng.uniform(0.5, 8.0))
        verify_ms = _staircase(6, float(rng.uniform(20, 60)), 60.0, 40)
        best = max(_rate(c, d, pass_ms, verify_ms) for d in range(1, k + 1))
        depth = _draft_until_stop(c, k, pass_ms, verify_ms, lambda j: k)
        assert _rate(c, depth, pass_ms, verify_ms) == pytest.approx(best, rel=1e-12), (c, pass_ms, depth)
        short = _draft_until_stop(c, k, pass_ms, verify_ms, lambda j: j + 1)
        lost.append(1 - _rate(c, short, pass_ms, verify_ms) / best)
    assert max(lost) > 0.05  # the one-step rule stops at a tile's edge where two more drafts would pay
