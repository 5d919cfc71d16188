"""The draft gate (avkit/scheduling/gate.py): mean-field depth, running mean, probes, bad settings."""

import numpy as np
import pytest

from avkit.errors import ConfigError
from avkit.scheduling.cost import CostTable
from avkit.scheduling.gate import DraftGate, best_depth, depth_rates, mean_survival


def _cost(draft_ms: float) -> CostTable:
    return CostTable((1, 8, 64), (10.0, 12.0, 40.0), (1, 8), (draft_ms, 2 * draft_ms))


@pytest.mark.parametrize("seed", range(5))
def test_best_depth_is_the_brute_force_argmax(seed):
    """Each depth's tokens and ms summed request by request, slot by slot (no cumsum, no vector cost)."""
    rng = np.random.default_rng(seed)
    survival = np.sort(rng.uniform(0, 1, 6))[::-1]
    cost = _cost(rng.uniform(0.1, 8.0))
    for n in (1, 3, 8):
        rates = []
        for d in range(7):
            tokens = sum(1 + sum(survival[j] for j in range(d)) for _ in range(n))
            ms = d * float(cost.draft_cost(n, 1)) + float(cost.context_cost(n)) + float(cost.verify_cost(n + n * d))
            rates.append(tokens / ms)
        assert best_depth(survival, n, cost) == rates.index(max(rates)), (n, rates)


def test_gate_drafts_when_drafts_pay_and_skips_when_they_cannot():
    sure = np.full(7, 0.95)
    cheap, dear = DraftGate(_cost(0.5)), DraftGate(_cost(60.0))
    for gate in (cheap, dear):
        assert gate.draft_this_step(4)  # nothing measured yet: draft to measure
        gate.fold(sure, 4)
    assert all(cheap.draft_this_step(4) for _ in range(10))
    assert not any(dear.draft_this_step(4) for _ in range(10)) and dear.skipped_total == 10
    useless = DraftGate(_cost(0.5))
    useless.draft_this_step(4)
    useless.fold(np.zeros(7), 4)  # nothing is ever accepted: even cheap drafts do not pay
    assert not useless.draft_this_step(4)


def test_resuming_needs_the_margin_continuing_does_not():
    """A 0 < gain < margin keeps a drafting gate drafting and a paused gate paused (the catch-up it would pay)."""
    survival, cost = np.full(7, 0.5), _cost(2.0)
    rates = depth_rates(survival, 4, cost)
    gain = rates.max() / rates[0] - 1.0
    assert 0.0 < gain < 0.5, gain  # the fixture sits in the band the test is about
    for margin, resumes in ((gain / 2, True), (gain * 2, False)):
        on, off = DraftGate(cost, resume_margin=margin), DraftGate(cost, resume_margin=margin)
        for gate in (on, off):
            gate.survival = survival
        off.skipped = 1
        assert on.draft_this_step(4) and off.draft_this_step(4) is resumes


def test_probes_come_after_probe_every_skips():
    gate = DraftGate(_cost(60.0), probe_every=3)
    gate.draft_this_step(2)
    gate.fold(np.full(5, 0.9), 2)
    pattern = [gate.draft_this_step(2) for _ in range(12)]
    assert pattern == [False, False, False, True] * 3


def test_running_mean_does_not_depend_on_how_rows_are_batched():
    """Folding a mean over b rows moves the curve as much as folding b single rows of that mean."""
    s0, s1 = np.linspace(0.9, 0.3, 7), np.linspace(0.6, 0.1, 7)
    one, many = DraftGate(_cost(1.0), window=10), DraftGate(_cost(1.0), window=10)
    for g in (one, many):
        g.fold(s0, 3)
    one.fold(s1, 5)
    for _ in range(5):
        many.fold(s1, 1)
    np.testing.assert_allclose(one.survival, many.survival, rtol=1e-12)
    assert np.all((one.survival < s0) & (one.survival > s1))


def test_mean_survival_and_state_roundtrip():
    conf = np.array([[0.5, 0.5, np.nan], [1.0, 0.2, 0.5]])
    np.testing.assert_allclose(mean_survival(conf), [0.75, 0.225, 0.05])
    gate = DraftGate(_cost(60.0))
    gate.draft_this_step(1)
    gate.observe(conf)
    state = gate.state()
    first = [gate.draft_this_step(1) for _ in range(5)]
    gate.restore(state)
    assert [gate.draft_this_step(1) for _ in range(5)] == first


@pytest.mark.parametrize("kwargs, match", [({"window": 0}, "gate_window"), ({"probe_every": 0}, "probe_every")])
def test_bad_settings_name_the_field(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DraftGate(_cost(1.0), **kwargs)
