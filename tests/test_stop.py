"""The early stop's look-ahead (avkit/scheduling/plan.py): requests draft on while a deeper step, priced whole,
pays; checked against brute force: a loop over groups and depths, the best depth of a staircase step cost for
one request, and the best common depth of a batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from avkit.scheduling.plan import continue_drafting, plan, single_group


def _staircase(tile: int, step_ms: float, base_ms: float, top: int) -> torch.Tensor:
    """[top + 1] verify ms by tokens: `base_ms` per started tile of `tile` query rows (the CPU kernel's 6-row tiles)."""
    t = torch.arange(top + 1, dtype=torch.float64)
    return base_ms + step_ms * torch.div(t + tile - 1, tile, rounding_mode="floor").clamp(min=1)


def _best_plan(rows, n_s: int, t: int, fixed_ms: float, row_ms: float, verify_ms) -> tuple[float, list[int]]:
    """Brute force over every budget b: rows (confidences, drafted, first guessed position) -> the best rate
    (tokens / ms) and each row's verified drafts, slots ranked as plan.py ranks them (survival desc, row,
    position); each guessed draft verified costs row_ms."""
    slots = []  # (survival, row, position, guessed)
    for i, (cs, n, first) in enumerate(rows):
        s = 1.0
        for pos in range(n):
            s *= min(max(float(np.nan_to_num(cs[pos])), 0.0), 1.0)
            slots.append((s, i, pos, pos >= first))
    slots.sort(key=lambda x: (-x[0], x[1], x[2]))
    rate, best_b, e, paid = n_s / (fixed_ms + float(verify_ms[t])), 0, float(n_s), 0.0
    for b, (s, _, _, guessed) in enumerate(slots, 1):
        e, paid = e + s, paid + row_ms * guessed
        r = e / (fixed_ms + paid + float(verify_ms[t + b]))
        if r > rate:
            rate, best_b = r, b
    won = [0] * len(rows)
    for _, i, _, _ in slots[:best_b]:
        won[i] += 1
    return rate, won


def _loop_oracle(conf, proposed, active, group, inputs, k):
    """The rule by hand, one group and one depth at a time: each group's rows as they stand and with every
    active row's next m drafts at the geometric mean of its confidences; m passes cost m bases (pass_ms - row_ms n_active)
    plus row_ms per guessed draft verified (a pass costs by the rows in it)."""
    out = [False] * conf.shape[0]
    j = conf.shape[1]
    for g in range(int(group.max()) + 1):
        idx = [r for r in range(conf.shape[0]) if int(group[r]) == g]
        n_s, t = int(inputs["num_sampling"][g]), int(inputs["num_scheduled"][g])
        fixed, pass_ms, row_ms = (float(inputs[key][g]) for key in ("fixed_ms", "pass_ms", "row_ms"))
        base = max(pass_ms - row_ms * sum(bool(active[r]) for r in idx), 0.0)
        price = {"n_s": n_s, "t": t, "row_ms": row_ms, "verify_ms": inputs["verify_ms"]}
        best, _ = _best_plan([(conf[r].tolist(), int(proposed[r]), int(proposed[r])) for r in idx],
                             fixed_ms=fixed, **price)
        best_won = None
        for m in range(1, k - j + 1):
            grown = []
            for r in idx:
                d = int(proposed[r])
                c = math.prod(min(max(float(np.nan_to_num(float(conf[r, i]))), 0.0), 1.0) for i in range(d)) ** (1 / d)
                n = int(proposed[r]) + (m if bool(active[r]) else 0)
                grown.append((conf[r].tolist()[:int(proposed[r])] + [c] * m, n, int(proposed[r])))
            rate, won = _best_plan(grown, fixed_ms=fixed + m * base, **price)
            if rate > best:  # strictly better: ties keep the smaller m (or stopping)
                best, best_won = rate, won
        if best_won is not None:
            for i, r in enumerate(idx):
                out[r] = bool(active[r]) and best_won[i] > int(proposed[r])
    return out


@pytest.mark.parametrize("seed", range(24))
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
    n = torch.as_tensor(sizes)
    inputs = {"num_sampling": n, "num_scheduled": n, "fixed_ms": torch.as_tensor(rng.uniform(1, 30, groups)),
              "pass_ms": torch.as_tensor(rng.uniform(0.5, 20, groups)),
              "row_ms": torch.as_tensor(rng.uniform(1, 8, groups)),
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
                                    pass_ms=torch.tensor([pass_ms], dtype=torch.float64),
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


def _group_rate(n: int, c: float, depth, pass_ms: float, verify_ms: torch.Tensor) -> float:
    """The best plan's tokens per ms for n requests at constant confidence c that drafted `depth` [n] each,
    paying max(depth) passes of `pass_ms`."""
    depth = torch.as_tensor(depth)
    one = torch.as_tensor([n])
    p = plan(torch.full((n, int(depth.max())), c, dtype=torch.float64), depth, single_group(n), 1, num_sampling=one,
             num_scheduled=one, fixed_ms=torch.tensor([int(depth.max()) * pass_ms], dtype=torch.float64),
             verify_ms=verify_ms)
    return float(p.expected[0] / p.cost_ms[0])


@pytest.mark.parametrize("seed", range(4))
def test_a_batch_drafts_on_where_only_all_its_rows_together_pay_the_next_tile(seed):
    """n requests at constant confidence on a 6-row-tile staircase (a tile is a large step, a pass is cheap):
    drafting pass by pass, the batch reaches the best rate of any common depth (brute force), where each row's
    next draft alone would start a tile for one token (the case that made a row-by-row rule stop at depth 1)."""
    rng = np.random.default_rng(seed)
    k = 7
    for _ in range(10):
        n, c = int(rng.integers(2, 9)), float(rng.uniform(0.7, 0.97))
        pass_ms, verify_ms = float(rng.uniform(1.0, 15.0)), _staircase(6, float(rng.uniform(40, 120)), 60.0, 9 * (k + 1))
        depth, active = torch.ones(n, dtype=torch.int64), torch.ones(n, dtype=torch.bool)
        one = torch.as_tensor([n])
        for j in range(1, k):
            if not active.any():
                break
            keep, _ = continue_drafting(torch.full((n, j), c, dtype=torch.float64).masked_fill(
                torch.arange(j)[None, :] >= depth[:, None], float("nan")), depth, active, single_group(n), 1,
                num_sampling=one, num_scheduled=one, fixed_ms=torch.tensor([j * pass_ms], dtype=torch.float64),
                pass_ms=torch.tensor([pass_ms], dtype=torch.float64), verify_ms=verify_ms, max_drafts=k)
            active = keep
            depth = depth + keep.long()
        best = max(_group_rate(n, c, torch.full((n,), d), pass_ms, verify_ms) for d in range(1, k + 1))
        assert _group_rate(n, c, depth, pass_ms, verify_ms) == pytest.approx(best, rel=1e-9), (n, c, pass_ms, depth)


def test_deeper_drafts_are_guessed_at_the_per_draft_rate_of_the_survival_so_far():
    """A request whose drafts so far had confidences 0.9 then 0.5 guesses its next ones at sqrt(0.45) = 0.67
    (the rate of its survival so far), not at its newest 0.5: with a cheap pass and 1 ms per verified token
    it drafts on, as the request with 0.5 then 0.9 does (guessed at 0.67 too). Its newest confidence alone,
    0.5, would stop it (the two rows are separate steps)."""
    conf = torch.tensor([[0.9, 0.5], [0.5, 0.9]], dtype=torch.float64)
    one = torch.ones(2, dtype=torch.int64)
    keep, _ = continue_drafting(conf, torch.tensor([2, 2]), torch.ones(2, dtype=torch.bool), torch.tensor([0, 1]), 2,
                                num_sampling=one, num_scheduled=one, fixed_ms=torch.full((2,), 1.0, dtype=torch.float64),
                                pass_ms=torch.full((2,), 0.5, dtype=torch.float64),
                                verify_ms=10.0 + torch.arange(40, dtype=torch.float64), max_drafts=5)
    assert keep.tolist() == [True, True]
    c = torch.full((1, 2), 0.5, dtype=torch.float64)  # a request at 0.5 throughout stops
    keep, _ = continue_drafting(c, torch.tensor([2]), torch.ones(1, dtype=torch.bool), single_group(1), 1,
                                num_sampling=one[:1], num_scheduled=one[:1], fixed_ms=torch.tensor([1.0], dtype=torch.float64),
                                pass_ms=torch.tensor([0.5], dtype=torch.float64),
                                verify_ms=10.0 + torch.arange(40, dtype=torch.float64), max_drafts=5)
    assert keep.tolist() == [False]
