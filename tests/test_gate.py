"""The draft gate (avkit/scheduling/gate.py): the replayed step rate, warm-up, hysteresis, probes."""

import numpy as np
import pytest

from avkit.config import AdaptiveConfig
from avkit.errors import ConfigError
from avkit.scheduling.cost import CostTable
from avkit.scheduling.gate import DraftGate, step_rates


def _cost(draft_ms: float, fixed_ms: float = 0.0) -> CostTable:
    return CostTable((1, 8, 64), (10.0, 12.0, 40.0), (1, 8), (draft_ms, 2 * draft_ms),
                     draft_fixed_ms=(fixed_ms, 1.5 * fixed_ms) if fixed_ms else ())


def _brute_rates(conf, n, cost, stop):
    """Slot by slot in Python: the top-m survivals, each row's depth, one draft pass per depth that
    runs when any of the n requests (each a random recent row) reaches it; the first pays the fixed part."""
    w, k = conf.shape
    surv = [[float(np.prod(conf[r, :j + 1])) for j in range(k)] for r in range(w)]
    ranked = sorted((-surv[r][j], r, j) for r in range(w) for j in range(k))
    out = []
    for m in range(w * k + 1):
        depth = [0] * w
        for _, r, _ in ranked[:m]:
            depth[r] += 1
        tokens = n + n / w * sum(-s for s, _, _ in ranked[:m])
        if stop:  # pass j runs unless all n requests stop short of it: P = 1 - (1 - p)^n
            draft = 0.0
            for j in range(1, k + 1):
                p = sum(d >= j for d in depth) / w
                if p > 0:
                    run = 1 - (1 - p) ** n
                    rows = n * p / run
                    draft += run * float(cost.draft_pass_cost(rows) + (j == 1) * cost.draft_fixed_cost(rows))
        else:
            draft = float(cost.draft_cost(n, k)) if m else 0.0
        out.append(tokens / (draft + float(cost.context_cost(n)) + float(cost.verify_cost(n + m * n / w))))
    return np.array(out)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("stop", [True, False])
@pytest.mark.parametrize("fixed", [0.0, 5.0])
def test_step_rates_equal_the_slot_by_slot_replay(seed, stop, fixed):
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.05, 0.99, (5, 4))
    cost = _cost(rng.uniform(0.1, 8.0), fixed)
    for n in (1, 3, 16):
        np.testing.assert_allclose(step_rates(conf, n, cost, stop), _brute_rates(conf, n, cost, stop), rtol=1e-12)


@pytest.mark.parametrize("stop", [True, False])
def test_many_windows_give_each_windows_rates_bit_for_bit(stop):
    """step_rates over G windows at once (the simulator's gate) equals it window by window (the live gate's)."""
    import torch

    rng = np.random.default_rng(5)
    conf, loads = rng.uniform(0.05, 0.99, (9, 6, 4)), [1, 5, 40, 3, 1, 16, 7, 2, 40]
    many = step_rates(conf, loads, _cost(3.0, 1.0), stop)
    assert many.shape == (9, 25)
    for g in range(9):
        assert torch.equal(many[g], step_rates(conf[g], loads[g], _cost(3.0, 1.0), stop)), g


@pytest.mark.parametrize("seed", range(3))
def test_replay_takes_the_step_by_step_decisions(seed):
    """`replay` prices many windows in one call while the gate drafts; its decisions, rows and counters are those
    of asking `draft_this_step` and observing step by step (a load that switches the gate on and off, probes)."""
    import torch

    rng = np.random.default_rng(seed)
    steps = 300
    loads = np.where(np.arange(steps) % 90 < 45, 2, 40) + rng.integers(0, 3, steps)  # [G] low, then high load
    rows = rng.integers(0, 5, steps)
    bounds = np.r_[0, np.cumsum(rows)]
    conf = torch.as_tensor(rng.uniform(0.3, 0.99, (bounds[-1], 4)))
    drafts = rng.random(bounds[-1]) < 0.9
    fast, slow = (DraftGate(_cost(4.0), AdaptiveConfig(gate_window=8, probe_every=20), k=4) for _ in range(2))
    got = fast.replay(loads, conf, bounds, drafts)
    want = []
    for g, n in enumerate(loads.tolist()):
        want.append(slow.draft_this_step(n))
        if want[-1]:
            slow.observe(conf[bounds[g]:bounds[g + 1]][torch.as_tensor(drafts[bounds[g]:bounds[g + 1]])])
    assert got.tolist() == want and 0 < sum(want) < steps  # it switched
    assert torch.equal(fast.rows, slow.rows) and (fast.skipped, fast.skipped_total) == (slow.skipped, slow.skipped_total)


def _gate(draft_ms: float, conf: float, **kw) -> DraftGate:
    gate = DraftGate(_cost(draft_ms), AdaptiveConfig(gate_window=8, **kw))
    gate.observe(np.full((8, 7), conf))
    return gate


def test_gate_drafts_when_drafts_pay_and_skips_when_they_cannot():
    cheap, dear = _gate(0.5, 0.95), _gate(60.0, 0.95)
    assert all(cheap.draft_this_step(4) for _ in range(10))
    assert not any(dear.draft_this_step(4) for _ in range(10)) and dear.skipped_total == 10
    assert not _gate(0.5, 0.0).draft_this_step(4)  # nothing is ever accepted: even cheap drafts do not pay


def test_gate_drafts_until_a_window_of_rows_was_seen():
    gate = DraftGate(_cost(6.0), AdaptiveConfig(gate_window=8))
    assert gate.sure_gain(4) > 1.0  # sure drafts would pay here: worth measuring
    for _ in range(3):
        assert gate.draft_this_step(4)
        gate.observe(np.full((3, 7), 0.5))  # 3, 6, 9 rows seen
    assert len(gate.rows) == 8 and not gate.draft_this_step(4)


def test_resuming_needs_the_margin_continuing_does_not():
    """A 0 < gain - 1 < margin keeps a drafting gate drafting and a paused gate paused (the catch-up it would pay)."""
    on = _gate(2.0, 0.5)
    gain = on.gain(4) - 1.0
    assert 0.0 < gain < 0.5, gain  # the fixture sits in the band the test is about
    for margin, resumes in ((gain / 2, True), (gain * 2, False)):
        on, off = _gate(2.0, 0.5, resume_margin=margin), _gate(2.0, 0.5, resume_margin=margin)
        off.skipped = 1
        assert on.draft_this_step(4)
        assert off.draft_this_step(4) is resumes


def test_probes_come_after_probe_every_skips_and_refill_the_window():
    gate = _gate(1.0, 0.05, probe_every=3)  # window 8; hopeless drafts, though sure ones would pay
    assert gate.sure_gain(2) > 1.0 + gate.config.resume_margin
    pattern = []
    for _ in range(3):
        pattern += [gate.draft_this_step(2) for _ in range(3)]  # off: nothing observed
        for _ in range(4):  # probe: 4 steps of 2 requests refill the window of 8 rows
            pattern.append(gate.draft_this_step(2))
            gate.observe(np.full((2, 7), 0.05))
    assert pattern == [False] * 3 + [True] * 4 + [False] * 3 + [True] * 4 + [False] * 3 + [True] * 4


def test_heterogeneous_rows_beat_their_mean():
    """Half sure, half hopeless rows: the budget drafts only for the sure half, which pays even where
    drafting every request to a uniform depth on the mean curve would not."""
    mixed = np.r_[np.full((4, 7), 0.97), np.full((4, 7), 0.05)]
    mean = np.cumprod(mixed, axis=1).mean(0)  # [K] mean survival
    uniform_conf = np.r_[mean[:1], mean[1:] / mean[:-1]][None, :].repeat(8, 0)  # one curve with that mean
    np.testing.assert_allclose(np.cumprod(uniform_conf, axis=1).mean(0), mean)
    gate = DraftGate(_cost(2.0), AdaptiveConfig(gate_window=8))
    gate.observe(uniform_conf)
    uniform = gate.gain(8)
    gate.observe(mixed)
    assert gate.gain(8) > 1.0 > uniform, (gate.gain(8), uniform)


def test_observe_keeps_the_latest_rows():
    gate = DraftGate(_cost(60.0), AdaptiveConfig(gate_window=4))
    gate.observe(np.full((3, 2), 0.1))
    gate.observe(np.array([[0.2, 0.2], [0.3, 0.3]]))
    np.testing.assert_allclose(gate.rows[:, 0].numpy(), [0.1, 0.1, 0.2, 0.3])


@pytest.mark.parametrize("kwargs, match", [({"gate_window": 0}, "--gate-window"), ({"probe_every": 0}, "--probe-every"),
                                           ({"resume_margin": -0.1}, "--resume-margin")])
def test_bad_settings_name_the_field(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DraftGate(_cost(1.0), AdaptiveConfig(**kwargs))


def test_a_gate_without_data_skips_only_where_sure_drafts_would_not_pay():
    """No rows yet: measure (draft) at a light load; at a load where even all-accepted drafts lose to
    target-only decoding, skip at once: no measurement could change the answer."""
    cost = CostTable((1, 8, 64, 512), (10.0, 12.0, 60.0, 500.0), (1, 8, 64), (2.0, 8.0, 60.0))
    gate = DraftGate(cost, AdaptiveConfig(gate_window=8), k=7)
    assert gate.sure_gain(1) > 1.0 > gate.sure_gain(64)
    assert gate.draft_this_step(1)
    assert not gate.draft_this_step(64) and gate.rows is None
    sure = gate.sure_gain(1)
    gate.observe(np.full((8, 7), 0.999999))  # rows all but sure: their gain approaches the bound from below
    assert sure * 0.999 < gate.gain(1) <= sure + 1e-12


def test_a_parallel_drafter_pays_one_pass_however_deep():
    """Stopping early saves an autoregressive drafter passes; a parallel one drafts K in one pass anyway."""
    conf = np.random.default_rng(0).uniform(0.3, 0.99, (6, 5))
    ar = _cost(3.0)
    par = CostTable(ar.verify_tokens, ar.verify_ms, ar.draft_requests, ar.draft_ms, drafter="parallel")
    np.testing.assert_allclose(step_rates(conf, 4, par, True), step_rates(conf, 4, par, False))
    assert not np.allclose(step_rates(conf, 4, ar, True), step_rates(conf, 4, ar, False))


def _paid_back_by_hand(cost, n, gain, lag, remaining):
    """The catch-up rule in plain Python: each lagging request's drafter prefill, interpolated on the
    profiled curve, against the ms per output token that drafting at `gain` saves over target-only."""
    (x0, x1), (y0, y1) = cost.prefill_tokens[-2:], cost.prefill_ms[-2:]
    price = sum(float(np.interp(x, cost.prefill_tokens, cost.prefill_ms)) if x <= x1
                else y1 + (y1 - y0) / (x1 - x0) * (x - x1) for x in lag if x > 2)  # the last slope beyond
    per_token = (float(np.interp(n, cost.verify_tokens, cost.verify_ms))) / n
    return price <= sum(remaining) * per_token * (1 - 1 / gain)


@pytest.mark.parametrize("seed", range(6))
def test_a_step_drafts_only_if_its_catch_up_is_paid_back(seed):
    """With lags and remaining tokens given, a step the rates say to draft drafts only when the drafter's
    prefill of the lagging requests costs no more than the tokens left save (sure drafts while measuring,
    the recent rows' gain after); without them the decision is the rates' alone."""
    rng = np.random.default_rng(seed)
    cost = CostTable((1, 8, 64), (10.0, 12.0, 40.0), (1, 8), (0.5, 1.0),
                     prefill_tokens=(16, 64, 256), prefill_ms=(2.0, 6.0, 20.0))
    decided = []
    for measured in (False, True):
        for _ in range(40):
            n = int(rng.integers(1, 9))
            lag = rng.choice([1, 2, 3, 40, 300], n).tolist()
            remaining = rng.integers(0, 64, n).tolist()
            gate = DraftGate(cost, AdaptiveConfig(gate_window=8), k=7)
            if measured:
                gate.observe(np.full((8, 7), rng.uniform(0.5, 0.95)))
            gain = gate.gain(n) if measured else gate.sure_gain(n)
            want = gain > 1.0 and _paid_back_by_hand(cost, n, gain, lag, remaining)
            assert gate.draft_this_step(n, lag, remaining) is want, (n, lag, remaining, gain)
            fresh = DraftGate(cost, AdaptiveConfig(gate_window=8), k=7)
            sure = DraftGate(cost, AdaptiveConfig(gate_window=8), k=7).sure_gain(n)
            assert fresh.draft_this_step(n) is (sure > 1)  # no lags: rates only
            decided.append(want)
    assert 0 < sum(decided) < len(decided)  # both answers occur

