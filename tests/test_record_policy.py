"""`avkit record --policy` with tiny random models, the generations table's decode timing, and the
simulator against the engine: the simulator runs the engine's policy object on the engine's own
recorded steps and must take the engine's decisions, step by step and request by request."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from avkit.cli import app
from avkit.config import EngineConfig, ModelsConfig, RecordConfig, SamplingConfig
from avkit.record import record
from avkit.scheduling.cost import CostTable
from avkit.scheduling.spec import parse_spec
from avkit.sim.drive import SimPolicy, decide
from avkit.sim.steps import Replay, Schedule, step_table
from avkit.trace.reader import read_traces
from avkit.trace.schema import generations_path

VOCAB, K, NEW = 320, 4, 100
# Step-shaped and steep: the budget trims and the early stop stops, so the decisions vary.
COST = CostTable((1, 2, 3, 4, 6, 8, 12, 16), (1.0, 1.3, 1.9, 2.2, 3.4, 4.0, 7.0, 9.0), (1, 4), (0.05, 0.08))


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from avkit.models import load
    from avkit.models.testing import write_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    prompts = root / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in (
        "def add(a, b):", "Hello, world!", "for i in range(10):", "import numpy as np", "The quick brown fox",
        "SELECT * FROM")) + "\n")
    cost = root / "cost.json"
    COST.save(cost)
    pair = load(write_tiny_model(root / "t", vocab=VOCAB, seed=0)), load(write_tiny_model(root / "d", vocab=VOCAB, seed=1))
    return root, prompts, cost, pair


_DONE: dict = {}


def _record(setup, policy: str, name: str, temperature: float = 1.0):
    """Record once per name in this module (the fixture's files)."""
    if name not in _DONE:
        _DONE[name] = _run(setup, policy, name, temperature)
    return _DONE[name]


def _run(setup, policy: str, name: str, temperature: float):
    root, prompts, cost, (target, draft) = setup
    cfg = RecordConfig(models=ModelsConfig(), decoding=EngineConfig(k=K, concurrency=3, seed=0),
                       sampling=SamplingConfig(temperature=temperature, max_new_tokens=NEW),
                       dataset=(str(prompts),), num_prompts=6, out=str(root / f"{name}.parquet"),
                       policy=policy, cost=str(cost))
    res = record(cfg, target=target, draft=draft, progress=False)
    return res, read_traces([res.trace_path])


def test_fixed_k_drafts_and_verifies_k(setup):
    res, df = _record(setup, "fixed:2", "fixed2")
    assert pq.read_metadata(res.trace_path).metadata[b"avkit.policy"] == b"fixed:2"
    assert df["num_drafted"].max() == 2 and (df["num_verified"] == df["num_drafted"]).all()


def test_adaptive_records_trimmed_slots_censored(setup):
    _, df = _record(setup, "adaptive-nogate:online_logistic", "adaptive")
    trimmed = df.filter(pl.col("position") >= pl.col("num_verified"))
    assert trimmed.height > 0, "the steep cost should trim some slots"
    assert not trimmed["verified"].any() and trimmed["accepted"].null_count() == trimmed.height
    verified = df.filter(pl.col("position") < pl.col("num_verified"))
    assert verified["verified"].all() and verified["confidence"].null_count() == 0


def test_generations_record_decode_timing(setup):
    res, _ = _record(setup, "fixed:2", "fixed2")
    gens = pl.read_parquet(generations_path(res.trace_path))
    n = gens["output_ids"].list.len()
    assert (n >= 2).all()
    assert (gens["admitted_s"] <= gens["first_token_s"]).all() and (gens["first_token_s"] < gens["last_token_s"]).all()
    decode = (n - 1) / (gens["last_token_s"] - gens["first_token_s"])  # steady-state tokens/s per request
    with_prefill = n / (gens["last_token_s"] - gens["admitted_s"])
    assert (decode > 0).all() and (with_prefill > 0).all() and (with_prefill < decode * n).all()
    times = gens["token_s"].to_list()  # each output token's step end: the run's engine steps, rebuilt
    assert [len(t) for t in times] == n.to_list() and all(np.all(np.diff(t) >= 0) for t in times)
    assert [t[0] for t in times] == gens["first_token_s"].to_list()
    assert [t[-1] for t in times] == gens["last_token_s"].to_list()
    assert len(np.unique(np.concatenate(times))) == res.engine_steps  # every step emits, and stamps once


def recorded_schedule(steps) -> Schedule:
    """The recording engine's own batches: one sim step per recorded engine step, in order, with its
    recorded batch size (requests that drafted nothing that step have no rows but count)."""
    order = np.lexsort((steps.request, steps.engine_step))  # [S] by engine step, then request
    eng = steps.engine_step[order]
    new = np.r_[True, eng[1:] != eng[:-1]]  # [S] first row of each engine step
    group = np.cumsum(new) - 1
    return Schedule(order, group, int(group[-1]) + 1, int(steps.batch_size.max()), steps.request[order],
                    steps.batch_size[order][new])


def _wanted(steps, max_new: int) -> np.ndarray:
    """[S] drafts the engine asked each request for (`draft_input`): min(K, tokens left - 1), the tokens
    emitted before a step being its earlier steps' accepted + 1 (no step skipped: the policies have no gate)."""
    emitted = np.zeros(steps.request.size, np.int64)
    out = steps.accepted + 1
    first = np.r_[True, steps.request[1:] != steps.request[:-1]]
    csum = np.cumsum(out)
    start = np.maximum.accumulate(np.where(first, np.arange(out.size), 0))
    emitted = csum - out - np.where(start > 0, csum[start - 1], 0)
    return np.minimum(steps.k, max_new - emitted - 1)


@pytest.mark.parametrize("spec, temperature", [("adaptive-nogate:online_logistic", 1.0),
                                               ("adaptive-stop-nogate:online_logistic", 1.0),
                                               ("adaptive-stop-nogate:online_logistic", 0.0)])
def test_the_simulator_decides_as_the_engine(setup, spec, temperature):
    """Same inputs (the engine's recorded steps: its batches, features, outcomes), the same policy object
    made from the same spec and cost: the simulator verifies (and, with -stop, drafts) exactly what the
    engine did, per request and step, through the estimator's refits. (No draft gate: a step the gate
    skips leaves no trace row, so a trace cannot replay the gate's own clock.)"""
    _, df = _record(setup, spec, spec.replace(":", "_") + str(temperature), temperature)
    steps = step_table(df, K)
    recorded_drafted, recorded_verified = steps.drafted.copy(), steps.verified.copy()
    steps = replace(steps, drafted=_wanted(steps, NEW))  # what the engine asked the drafter for
    assert (recorded_drafted <= steps.drafted).all()
    replay = Replay.build(steps, recorded_schedule(steps), COST)
    policy = SimPolicy(parse_spec(spec), burn_in=False).make(steps, COST)
    k, drafted, _ = decide(policy, replay)
    rows = replay.sched.rows
    assert replay.num_requests.size > 100 and policy.estimator.rounds >= 1  # refits live and here
    np.testing.assert_array_equal(drafted, recorded_drafted[rows])
    np.testing.assert_array_equal(k, recorded_verified[rows])
    assert (k < drafted).any() or (drafted < steps.drafted[rows]).any()  # the policy did decide something


def test_bad_policy_is_one_line_before_loading_models(setup, capsys):
    root, prompts, _, _ = setup
    with pytest.raises(SystemExit) as e:
        app(["record", "--dataset", str(prompts), "--target", str(root / "missing"), "--policy", "fixed:x",
             "--out", str(root / "bad.parquet")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err == ["avkit: error: --policy fixed:x: fixed:K needs a non-negative integer K"], err


def test_learned_cost_is_written_from_the_runs_steps(setup):
    root, prompts, cost, (target, draft) = setup
    out = root / "learned.json"
    cfg = RecordConfig(models=ModelsConfig(), decoding=EngineConfig(k=K, concurrency=3, seed=0),
                       sampling=SamplingConfig(temperature=1.0, max_new_tokens=NEW), dataset=(str(prompts),),
                       num_prompts=6, out=str(root / "learn.parquet"), policy="adaptive-stop:online_logistic",
                       cost=str(cost), learn_cost=True, cost_out=str(out))
    res = record(cfg, target=target, draft=draft, progress=False)
    learned = CostTable.load(out)
    assert learned.meta["source"] == "learned" and learned.meta["steps"] == res.engine_steps
    # the learned model prices the run's own steps (shape and wall time from the trace) closer than the prior
    steps = read_traces([res.trace_path]).group_by("engine_step").agg(
        pl.col("batch_size").first(), pl.col("num_drafted").max(), pl.col("step_time_ms").first(),
        (pl.col("batch_size").first() + pl.col("num_verified").filter(pl.col("position") == 0).sum()).alias("tokens"))
    n, k, tokens, ms = (steps[c].to_numpy() for c in ("batch_size", "num_drafted", "tokens", "step_time_ms"))
    error = lambda table: np.median(np.abs(np.log(table.step_cost(n, k, tokens) / ms)))
    assert error(learned) < error(COST), (error(learned), error(COST))


@pytest.mark.parametrize(("argv", "message"), [
    (["--policy", "fixed:2", "--learn-cost"], "--learn-cost needs an adaptive policy (fixed and scheduled ones "
                                              "price nothing), got --policy fixed:2"),
    (["--policy", "adaptive:online_logistic", "--cost-out", "c.json"], "--cost-out c.json needs --learn-cost (it "
                                                                        "writes what the policy learned)")])
def test_learn_cost_options_are_checked(setup, capsys, argv, message):
    root, prompts, _, _ = setup
    with pytest.raises(SystemExit) as e:
        app(["record", "--dataset", str(prompts), "--out", str(root / "bad.parquet"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err == [f"avkit: error: {message}"], err


def test_trace_steps_are_the_steps_the_learner_saw(setup, monkeypatch):
    """sim/steps.py `trace_steps` rebuilds, from a written trace and its generations table, each engine step that
    drafted and admitted no one as the engine handed it to the cost learner: requests, passes, tokens, context (the
    oracle: the StepTimes the learner observed during the same recording, in order; their wall time is timed
    apart from the trace's step_time_ms, a few ms apart on tiny models)."""
    from avkit.scheduling.learn import CostLearner
    from avkit.sim.steps import trace_steps

    seen, observe = [], CostLearner.observe
    monkeypatch.setattr(CostLearner, "observe", lambda self, t: seen.append(t) or observe(self, t))
    root, prompts, cost, (target, draft) = setup
    cfg = RecordConfig(models=ModelsConfig(), decoding=EngineConfig(k=K, concurrency=3, seed=0),
                       sampling=SamplingConfig(temperature=1.0, max_new_tokens=NEW), dataset=(str(prompts),),
                       num_prompts=6, out=str(root / "steps.parquet"), policy="adaptive-stop:online_logistic",
                       cost=str(cost), learn_cost=True, cost_out=str(root / "steps.json"))
    res = record(cfg, target=target, draft=draft, progress=False)
    rebuilt = trace_steps(res.trace_path)
    key = lambda t: (t.num_requests, t.passes, t.tokens, t.context_tokens)
    assert 0 < len(rebuilt) < len(seen) and len(set(map(key, rebuilt))) > 5
    left = iter(map(key, seen))  # in order: each rebuilt step is a later step the learner saw
    missed = [t for t in rebuilt if key(t) not in left]
    assert not missed, missed
