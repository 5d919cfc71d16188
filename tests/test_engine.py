"""The engine on tiny random models: greedy equivalence, determinism, batching, stops, trace rows, bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import avkit.models
from avkit.config import EngineConfig, SamplingConfig
from avkit.errors import ConfigError
from avkit.models.testing import write_tiny_model
from avkit.runtime.engine import Engine
from avkit.runtime.request import FINISH_LENGTH, FINISH_STOP, Request
from avkit.runtime.trace_rows import MemorySink
from avkit.scheduling.policy import FixedK
from avkit.trace.schema import REQUIRED, TRACE_SCHEMA

torch.set_num_threads(1)
VOCAB = 300


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """target, a noisy copy of it (a draft that is often right), and an unrelated model."""
    root = tmp_path_factory.mktemp("engine_models")
    target = avkit.models.load(write_tiny_model(root / "t", vocab=VOCAB, seed=0, init_std=0.3))
    noisy = avkit.models.load(root / "t")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in noisy.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3 * p.std())
    other = avkit.models.load(write_tiny_model(root / "o", vocab=VOCAB, seed=1, init_std=0.3))
    return {"target": target, "noisy": noisy, "other": other}


def _requests(n, temperature=0.0, max_new_tokens=24, seed=None, **kw):
    return [Request(f"r{i}", [(7 * i + j) % 250 + 5 for j in range(3 + 2 * i)],
                    SamplingConfig(temperature=temperature, top_p=0.9, max_new_tokens=max_new_tokens, seed=seed),
                    **kw) for i in range(n)]


def _no_eos(m):  # random models emit EOS at random; most tests want full-length outputs
    return dataclasses.replace(m, tokenizer=type("T", (), {"eos_token_ids": set()})())


@pytest.mark.parametrize("draft", ["noisy", "other", "target"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_equals_target_only(models, draft, k):
    target = _no_eos(models["target"])
    reqs = _requests(5)
    ref = Engine(target, None, EngineConfig(k=0, concurrency=3, max_len=96)).generate(reqs)
    sink = MemorySink()
    spec = Engine(target, models[draft], EngineConfig(k=k, concurrency=3, max_len=96), sink=sink).generate(reqs)
    for a, b in zip(ref, spec):
        assert b.output_ids == a.output_ids, a.request_id
        assert len(b.output_ids) == 24 and b.finish_reason == FINISH_LENGTH
    rows = sink.columns()
    if draft == "target":  # the draft is the target: every verified greedy draft is accepted
        assert bool(np.all(rows["accepted"].filled(False)[rows["verified"]]))


def test_seeded_runs_are_deterministic_and_batch_independent(models):
    target = _no_eos(models["target"])
    reqs = _requests(6, temperature=1.0, seed=11)
    a = Engine(target, models["noisy"], EngineConfig(k=3, concurrency=4, max_len=96)).generate(reqs)
    b = Engine(target, models["noisy"], EngineConfig(k=3, concurrency=4, max_len=96)).generate(reqs)
    assert [g.output_ids for g in a] == [g.output_ids for g in b]
    alone = Engine(target, models["noisy"], EngineConfig(k=3, concurrency=1, max_len=96)).generate(reqs[2:3])
    assert alone[0].output_ids == a[2].output_ids  # same keys, different batch
    other_seed = Engine(target, models["noisy"], EngineConfig(k=3, concurrency=4, max_len=96)).generate(
        _requests(6, temperature=1.0, seed=12))
    assert [g.output_ids for g in other_seed] != [g.output_ids for g in a]


def test_continuous_batching_and_stops(models):
    target = models["target"]
    stop = 17
    reqs = [Request("long", [5, 6, 7], SamplingConfig(temperature=0.0, max_new_tokens=40)),
            Request("short", [8, 9], SamplingConfig(temperature=0.0, max_new_tokens=3))]
    engine = Engine(_no_eos(target), models["noisy"], EngineConfig(k=4, concurrency=2, max_len=128))
    engine.add_request(reqs[0])
    first = engine.step()
    assert [o.request_id for o in first] == ["long"]
    engine.add_request(reqs[1])  # joins between steps
    seen, done = {"long": [], "short": []}, {}
    while engine.has_unfinished():
        for o in engine.step():
            seen[o.request_id] += o.new_token_ids
            if o.finished:
                done[o.request_id] = o.finish_reason
    assert len(seen["short"]) == 3 and done["short"] == FINISH_LENGTH
    # A stop id ends the request right after it is emitted, even mid-step.
    ref = first[0].new_token_ids + seen["long"]
    tok = ref[5]
    g = Engine(_no_eos(target), models["noisy"], EngineConfig(k=4, concurrency=2, max_len=128)).generate(
        [dataclasses.replace(reqs[0], stop_token_ids=(tok, stop))])[0]
    cut = next(i for i, t in enumerate(ref) if t in (tok, stop))
    assert g.output_ids == ref[: cut + 1] and g.finish_reason == FINISH_STOP


def test_max_len_finishes_with_length(models):
    engine = Engine(_no_eos(models["target"]), models["noisy"], EngineConfig(k=5, concurrency=1, max_len=16))
    g = engine.generate([Request("r", list(range(5, 15)), SamplingConfig(temperature=0.0, max_new_tokens=50))])[0]
    assert g.finish_reason == FINISH_LENGTH and len(g.prompt_ids) + len(g.output_ids) == 16


def test_abort_frees_the_slot(models):
    engine = Engine(_no_eos(models["target"]), models["noisy"], EngineConfig(k=2, concurrency=1, max_len=64))
    engine.add_request(Request("a", [5, 6], SamplingConfig(temperature=0.0, max_new_tokens=30)))
    engine.add_request(Request("b", [7, 8], SamplingConfig(temperature=0.0, max_new_tokens=2)))
    engine.step()
    assert engine.abort("a") and not engine.abort("zzz")
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert {o.request_id for o in outs} == {"b"}


class _TrimToTwo(FixedK):
    """Drafts the engine's K and verifies the first k: a policy that trims after drafting."""

    def draft_limits(self, load, lag, remaining):
        return None


def test_trace_rows_follow_the_schema(models):
    sink = MemorySink()
    policy = _TrimToTwo(2)  # drafts 4, verifies 2: the trimmed slots must be censored
    engine = Engine(_no_eos(models["target"]), models["noisy"], EngineConfig(k=4, concurrency=3, max_len=96),
                    policy=policy, sink=sink)
    gens = engine.generate(_requests(3, temperature=1.0, max_new_tokens=12, seed=3, dataset="demo"))
    cols = sink.columns()
    assert set(REQUIRED) - {"run_id"} <= set(cols)
    n = len(cols["position"])
    assert all(len(v) == n for v in cols.values())
    for name, values in cols.items():
        if not TRACE_SCHEMA.field(name).nullable:
            assert not isinstance(values, np.ma.MaskedArray) or not values.mask.any(), name
    verified, accepted = cols["verified"], cols["accepted"]
    assert (cols["num_verified"] <= 2).all() and (verified == (cols["position"] < cols["num_verified"])).all()
    assert (~verified).any()
    assert accepted.mask[~verified].all()  # trimmed slots are censored
    observed = ~accepted.mask
    assert (observed == verified & (cols["position"] <= cols["num_accepted"])).all()
    assert (accepted.filled(False) == (cols["position"] < cols["num_accepted"])).all()
    assert np.all((cols["q_sampled"] > 0) & (cols["q_sampled"] <= 1))
    assert cols["target_prob"].mask[~verified].all() and not cols["target_prob"].mask[verified].any()
    assert (np.diff(cols["engine_step"]) >= 0).all() and set(cols["dataset"]) == {"demo"}
    # Tokens per request = accepted drafts + one per step (the last steps may draft nothing).
    for g in gens:
        first = (cols["request_id"] == g.request_id) & (cols["position"] == 0)
        assert len(g.output_ids) == int(cols["num_accepted"][first].sum()) + g.num_steps


@pytest.mark.parametrize("kwargs", [{"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5},
                                    {"max_new_tokens": 0}])
def test_bad_sampling_config(kwargs):
    with pytest.raises(ConfigError, match="^--" + next(iter(kwargs)).replace("_", "-") + " must be"):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [{"k": -1}, {"concurrency": 0}, {"k": 7, "max_len": 8}])
def test_bad_engine_config(kwargs):
    with pytest.raises(ConfigError):
        EngineConfig(**kwargs)


def test_bad_requests(models, tmp_path):
    with pytest.raises(ConfigError, match="prompt_ids is empty"):
        Request("r", [])
    engine = Engine(models["target"], models["noisy"], EngineConfig(k=2, concurrency=1, max_len=16))
    with pytest.raises(ConfigError, match="max_len"):
        engine.add_request(Request("r", list(range(5, 25))))
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        engine.add_request(Request("r", [VOCAB + 3]))
    engine.add_request(Request("r", [5]))
    with pytest.raises(ConfigError, match="already"):
        engine.add_request(Request("r", [6]))
    small_dir = write_tiny_model(tmp_path / "v", vocab=280, seed=2)
    with pytest.raises(ConfigError, match="vocabulary"):
        Engine(models["target"], avkit.models.load(small_dir), EngineConfig(k=2))


def test_greedy_and_sampled_requests_share_a_batch(models):
    """T = 0 rows go through probabilistic verification as one-hot distributions: still exact greedy."""
    target = _no_eos(models["target"])
    greedy = _requests(3)
    ref = Engine(target, None, EngineConfig(k=0, concurrency=3, max_len=96)).generate(greedy)
    sampled = [dataclasses.replace(r, request_id=r.request_id + "s",
                                   sampling=SamplingConfig(temperature=1.0, max_new_tokens=24, seed=5))
               for r in greedy]
    mixed = [r for pair in zip(greedy, sampled) for r in pair]
    out = Engine(target, models["noisy"], EngineConfig(k=3, concurrency=6, max_len=96)).generate(mixed)
    assert [g.output_ids for g in out[::2]] == [g.output_ids for g in ref]


def test_k_zero_ignores_the_draft(models):
    engine = Engine(models["target"], models["noisy"], EngineConfig(k=0, concurrency=2, max_len=64))
    assert engine.drafter is None
    g = engine.generate(_requests(2, max_new_tokens=5))
    assert all(x.num_steps == len(x.output_ids) for x in g)  # one token per step


def test_chunked_and_grouped_prefill_change_nothing(models, monkeypatch):
    import avkit.runtime.prefill

    target = _no_eos(models["target"])
    reqs = _requests(4) + [Request("same-len", [(7 * 3 + j) % 250 + 5 for j in range(9)],
                                   SamplingConfig(temperature=0.0, max_new_tokens=24))]
    ref = Engine(target, models["noisy"], EngineConfig(k=3, concurrency=5, max_len=96)).generate(reqs)
    monkeypatch.setattr(avkit.runtime.prefill, "PREFILL_CHUNK", 2)
    out = Engine(target, models["noisy"], EngineConfig(k=3, concurrency=5, max_len=96)).generate(reqs)
    assert [g.output_ids for g in out] == [g.output_ids for g in ref]


@pytest.mark.gpu
def test_engine_runs_on_cuda(models):
    """Every per-step tensor follows the model's device; greedy speculative == target-only on the GPU."""
    import copy

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")

    def cuda(m):
        return dataclasses.replace(_no_eos(m), model=copy.deepcopy(m.model).to("cuda"))

    target, draft = cuda(models["target"]), cuda(models["noisy"])
    reqs = _requests(4)
    ref = Engine(target, None, EngineConfig(k=0, concurrency=4, max_len=96)).generate(reqs)
    sink = MemorySink()
    spec = Engine(target, draft, EngineConfig(k=4, concurrency=4, max_len=96), sink=sink).generate(reqs)
    assert [g.output_ids for g in spec] == [g.output_ids for g in ref]
    sampled = Engine(target, draft, EngineConfig(k=4, concurrency=4, max_len=96)).generate(
        _requests(4, temperature=1.0, seed=3))
    assert all(len(g.output_ids) == 24 for g in sampled) and len(sink) > 0


@pytest.mark.slow
def test_real_pair_greedy_and_acceptance():
    """The real pair (~10 GB RAM, minutes on 2 cores): greedy speculative == target-only, and the
    code prompt's per-slot acceptance is high (docs/runtime.md reports ~0.93 on HumanEval at T=0.8)."""
    from avkit.config import DEFAULT_DRAFT, DEFAULT_TARGET

    target, draft = avkit.models.load(DEFAULT_TARGET), avkit.models.load(DEFAULT_DRAFT)
    ids = target.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that returns the sum of the squares of a list."}])
    req = Request("r", ids, SamplingConfig(temperature=0.0, max_new_tokens=48))
    ref = Engine(target, None, EngineConfig(k=0, concurrency=1, max_len=512)).generate([req])[0]
    sink = MemorySink()
    spec = Engine(target, draft, EngineConfig(k=5, concurrency=1, max_len=512), sink=sink).generate([req])[0]
    assert spec.output_ids == ref.output_ids  # fp32: verify and decode forwards agree on the argmax
    assert "def" in target.tokenizer.decode(spec.output_ids)
    assert sink.columns()["accepted"].compressed().mean() > 0.6


def test_draft_gate_skips_speculation_and_stays_exact(models):
    """Adaptive policy with an unrelated drafter whose drafts are hopeless: the gate skips drafting for
    most steps (target-only decoding, no trace rows), probes after 2 skipped steps, and greedy output is
    unchanged."""
    from avkit.config import AdaptiveConfig
    from avkit.scheduling.adaptive import make_adaptive
    from avkit.scheduling.cost import CostTable

    target = _no_eos(models["target"])
    reqs = _requests(5)
    ref = Engine(target, None, EngineConfig(k=0, concurrency=3, max_len=96)).generate(reqs)
    cost = CostTable((1, 100), (10.0, 11.0), (1, 100), (3.0, 3.0))  # sure drafts would pay, hopeless ones not
    policy = make_adaptive(cost=cost, estimator="online_logistic", k=4, stop_drafting=True,
                           adaptive=AdaptiveConfig(gate_window=6, probe_every=2))
    sink = MemorySink()
    engine = Engine(target, models["other"], EngineConfig(k=4, concurrency=3, max_len=96), policy=policy, sink=sink)
    out = engine.generate(reqs)
    assert [g.output_ids for g in out] == [g.output_ids for g in ref]
    drafted_steps = np.unique(sink.columns()["engine_step"]).size  # trace rows come from drafted steps only
    assert policy.gate.skipped_total > 0 and drafted_steps > 0
    # the gate is asked whenever some request may draft (not on steps whose requests all need only 1 token)
    assert drafted_steps + policy.gate.skipped_total == policy.gate.steps <= engine.stats.steps
    assert policy.gate.skipped_total <= 2 * drafted_steps  # a probe after at most 2 skips in a row


@pytest.mark.parametrize("prefill_ms, drafts", [(1e9, False), (0.0, True)])
def test_the_gate_prices_the_drafter_catch_up_from_the_engine_lags(models, prefill_ms, drafts):
    """The engine gives the gate each request's drafter lag and remaining tokens: with the drafter's
    prefill priced so dear that no prompt's catch-up is ever paid back, the adaptive engine never drafts
    (its drafter runs no forward) and emits target-only decoding's tokens; priced free, it drafts."""
    from avkit.config import AdaptiveConfig
    from avkit.scheduling.adaptive import make_adaptive
    from avkit.scheduling.cost import CostTable

    target = _no_eos(models["target"])
    reqs = _requests(3, max_new_tokens=12)
    ref = Engine(target, None, EngineConfig(k=0, concurrency=3, max_len=96)).generate(reqs)
    cost = CostTable((1, 100), (10.0, 11.0), (1, 100), (0.5, 0.5),  # sure drafts pay at every load
                     prefill_tokens=(1, 1024), prefill_ms=(prefill_ms, prefill_ms))
    policy = make_adaptive(cost=cost, estimator="online_logistic", k=4, stop_drafting=True,
                           adaptive=AdaptiveConfig(gate_window=6))
    engine = Engine(target, models["noisy"], EngineConfig(k=4, concurrency=3, max_len=96), policy=policy)
    out = engine.generate(reqs)
    assert [g.output_ids for g in out] == [g.output_ids for g in ref]
    assert (engine.drafter.forward_s > 0) is drafts
    assert (policy.gate.skipped_total == policy.gate.steps > 0) is not drafts
