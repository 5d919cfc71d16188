"""The cost model learned online (avkit/scheduling/learn.py): it converges to a shifted cost through spikes and
warm-up outliers, probes on a schedule no token can move, and its snapshot is a cost file."""

from __future__ import annotations

import numpy as np
import pytest

from avkit.scheduling.cost import CostTable
from avkit.scheduling.learn import CostLearner, context_band
from avkit.step_types import StepTime

PRIOR = CostTable(verify_tokens=tuple(range(1, 17)) + (32,),
                  verify_ms=tuple(40.0 + 12.0 * ((t + 5) // 6) for t in range(1, 17)) + (110.0,),
                  draft_requests=(1, 2, 4, 8), draft_ms=(10.0, 11.0, 13.0, 18.0), meta={"source": "profile", "k": 7},
                  context_len=512)
TRUE = PRIOR.with_curves(verify_ms=[1.3 * v for v in PRIOR.verify_ms], draft_ms=[0.8 * d for d in PRIOR.draft_ms])
SHAPES = [(n, p, n + n * v) for n in (1, 2, 4) for p in (0, 3, 5) for v in range(0, p + 1, 2)]


def _spiky(rng, seen: dict, key, ms: float) -> float:
    """2% noise, 10% spikes (x 3), each shape's first 2 steps x 2 (warm-up)."""
    seen[key] = seen.get(key, 0) + 1
    ms *= 1 + 0.02 * rng.standard_normal()
    if seen[key] <= 2 or rng.random() < 0.10:
        ms *= 3.0 if seen[key] > 2 else 2.0
    return ms


def _stream(seed: int, steps: int):
    """Steps of the shapes above at the table's context (held_context), timed by TRUE through `_spiky`."""
    rng = np.random.default_rng(seed)
    seen = {}
    for _ in range(steps):
        n, p, t = SHAPES[int(rng.integers(len(SHAPES)))]
        ctx = int(PRIOR.held_context(n, t))
        yield StepTime(n, p, t, ctx, _spiky(rng, seen, (n, p, t), float(TRUE.step_cost(n, p, t, ctx))), False)


def test_learner_converges_to_a_shifted_cost_through_spikes():
    """Verify 30% dearer and drafting 20% cheaper than profiled: after 4,000 steps (fixed seed) every visited
    shape is predicted within 3% of the true cost (the prior is off by up to 30%)."""
    learner = CostLearner(PRIOR)
    for step in _stream(0, 4000):
        learner.observe(step)
    model = learner.refit()
    for n, p, t in SHAPES:
        assert float(model.step_cost(n, p, t) / TRUE.step_cost(n, p, t)) == pytest.approx(1.0, abs=0.03), (n, p, t)
    assert max(abs(PRIOR.step_cost(n, p, t) / TRUE.step_cost(n, p, t) - 1) for n, p, t in SHAPES) > 0.2
    assert model.meta["source"] == "learned" and np.all(np.diff(model.verify_ms) >= 0)


def test_few_steps_stay_near_the_prior_and_untouched_points_keep_it():
    """The prior's pseudo-count: 3 clean steps of one shape move it only part of the way; ordinates no step
    touches (verify at 32 tokens, drafting at 8 requests) keep the prior exactly."""
    learner = CostLearner(PRIOR, warmup=0)
    for _ in range(3):
        learner.observe(StepTime(1, 0, 1, None, 2.0 * float(PRIOR.step_cost(1, 0, 1)), False))
    model = learner.refit()
    moved = float(model.step_cost(1, 0, 1) / PRIOR.step_cost(1, 0, 1))
    assert 1.0 < moved < 1.0 + 3 / (3 + learner.prior_count) + 1e-9
    assert model.verify_ms[-1] == PRIOR.verify_ms[-1] and model.draft_ms[-1] == PRIOR.draft_ms[-1]


def test_probes_follow_the_step_count_only():
    """Two different token streams (different shapes and times): the same probe steps and depths."""
    a, b = CostLearner(PRIOR, probe_every=7), CostLearner(PRIOR, probe_every=7)
    got = {}
    for name, learner, seed in (("a", a, 1), ("b", b, 2)):
        got[name] = []
        for step in _stream(seed, 300):
            got[name].append(learner.probe_depth(7))
            learner.observe(step)
    assert got["a"] == got["b"]
    probes = [(i, d) for i, d in enumerate(got["a"]) if d is not None]
    assert [i for i, _ in probes] == list(range(6, 300, 7)) and {d for _, d in probes} == set(range(8))


def test_snapshot_is_a_cost_file(tmp_path):
    learner = CostLearner(PRIOR)
    for step in _stream(3, 500):
        learner.observe(step)
    path = tmp_path / "learned.json"
    learner.snapshot(path)
    back = CostTable.load(path)
    assert back.to_json() == {**learner.model.to_json(), "meta": back.to_json()["meta"]}
    assert back.meta["source"] == "learned" and back.meta["steps"] == 500
    (tmp_path / "dir").mkdir()
    with pytest.raises(Exception):
        learner.snapshot(tmp_path / "dir")  # cannot replace a directory: raises, writes nothing
    assert CostTable.load(path).to_json() == back.to_json()  # the earlier snapshot is intact


KV, LOOKUP = 0.002, 1.5  # ms per context token beyond the table's, ms per cache lookup
LIVE = TRUE.with_curves()
LIVE = CostTable(**{**LIVE.__dict__, "kv_ms_per_token": KV, "lookup_ms": LOOKUP})
CONTEXTS = (200, 900, 3000)  # cached tokens per request: three context bands
HYBRID = [(n, p, t, m) for n, p, t in SHAPES if p for m in range(1, n)]  # m < n rows drafted by the model


def _live_stream(seed: int, steps: int):
    """Model-drafted, target-only and hybrid steps (cache lookups for every request, draft passes over m of
    them) at three contexts that drift by up to 5% as requests grow, timed by LIVE through `_spiky`."""
    rng = np.random.default_rng(seed)
    seen = {}
    for _ in range(steps):
        if rng.random() < 0.3:
            n, p, t, m = HYBRID[int(rng.integers(len(HYBRID)))]
            looks = n
        else:
            (n, p, t), m, looks = SHAPES[int(rng.integers(len(SHAPES)))], None, 0
        per = CONTEXTS[int(rng.integers(len(CONTEXTS)))]
        ctx = int(n * per * (1 + 0.05 * rng.random()))
        ms = float(LIVE.step_cost(n, p, t, ctx, m, looks))
        yield StepTime(n, p, t, ctx, _spiky(rng, seen, (n, p, t, m, per), ms), False, m, looks)


def test_learner_learns_the_kv_slope_and_hybrid_steps():
    """Context moves the price (0.002 ms per cached token beyond the table's, which holds 512 per verify row)
    and hybrid steps pay 1.5 ms per cache lookup with draft passes over fewer rows: after 8,000 steps (fixed
    seed; spikes, warm-up outliers) every visited shape at every context band is predicted within 4% (the
    prior is off by more than 25% on some), the KV slope and the lookup price within 15% of the truth."""
    learner = CostLearner(PRIOR)
    steps = list(_live_stream(0, 8000))
    for step in steps:
        learner.observe(step)
    model = learner.refit()
    assert model.kv_ms_per_token == pytest.approx(KV, rel=0.15) and model.lookup_ms == pytest.approx(LOOKUP, rel=0.15)
    worst_prior, checked = 0.0, set()
    for s in steps:
        key = (s.num_requests, s.passes, s.tokens, s.draft_rows, context_band(s.context_tokens, s.num_requests))
        if key in checked:
            continue
        checked.add(key)
        args = (s.num_requests, s.passes, s.tokens, s.context_tokens, s.draft_rows, s.lookups)
        truth = float(LIVE.step_cost(*args))
        assert float(model.step_cost(*args)) / truth == pytest.approx(1.0, abs=0.04), key
        worst_prior = max(worst_prior, abs(float(PRIOR.step_cost(*args)) / truth - 1))
    assert len(checked) > 100 and worst_prior > 0.25


def test_catch_up_steps_are_counted_not_learned():
    """A step whose time holds a catch-up prefill (unpriced) advances the clock but never enters a bucket."""
    learner = CostLearner(PRIOR, warmup=0)
    for _ in range(5):
        learner.observe(StepTime(2, 3, 4, 1024, 500.0, True))
    assert learner.steps == 5 and not learner.buckets and learner.refit() is PRIOR
