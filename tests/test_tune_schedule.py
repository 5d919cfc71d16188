"""The `schedule` verify policy (avkit/scheduling/batch_schedule.py): K by batch size, as the tuner wrote it.

Checked against brute force: K(b) is the K of the range holding b (the last range's past it) for schedules
read from `avkit tune --out` JSON and from its vLLM fragment; in the engine, every step at batch size b
drafts at most K(b) per request, verifies min(drafted, K(b)), drafts nothing where K(b) = 0, and the
greedy output equals target-only decoding token for token. The catch-up rule (scheduling/batch_schedule.py)
against a brute-force loop, and in the engine: the lags it is given are the drafter's, a request it keeps out
runs no drafter forward, output unchanged. Bad schedule files are one error line, exit 2.
"""

from __future__ import annotations

import json
import random

import numpy as np

import pytest
import torch

from avkit.cli import app
from avkit.config import EngineConfig, SamplingConfig
from avkit.errors import ConfigError
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.scheduling.batch_schedule import FREE_LAG, BatchSchedule, CatchUpRule, ScheduledK
from avkit.scheduling.cost import CostTable
from avkit.scheduling.spec import POLICIES
from avkit.step_types import DraftBatch, Load
from avkit.tune.formats import vllm_spec
from avkit.tune.schedule import ranges


def _brute(schedule: list[tuple[int, int, int]], b: int) -> int:
    for lo, hi, k in schedule:
        if lo <= b <= hi:
            return k
    return schedule[-1][2]  # past the last range


def _random_schedule(rng: random.Random) -> list[tuple[int, int, int]]:
    conc = sorted(rng.sample(range(1, 40), rng.randint(1, 6)))
    return ranges(conc, [rng.randint(0, 5) for _ in conc])


@pytest.mark.parametrize("seed", range(20))
def test_k_at_every_batch_size_is_the_schedules_from_both_file_forms(tmp_path, seed):
    schedule = _random_schedule(random.Random(seed))
    tune_json, frag = tmp_path / "tune.json", tmp_path / "vllm.json"
    tune_json.write_text(json.dumps({"schedule": {"ranges": [list(r) for r in schedule]}}))
    frag.write_text(json.dumps(vllm_spec(schedule, adaptive=False)))  # what --format vllm prints
    for path in (tune_json, frag):
        got = BatchSchedule.load(path)
        if max(k for _, _, k in schedule) == 0:  # the fragment is `null`: speculation off
            assert all(got.k_at(b) == 0 for b in range(1, 60))
            continue
        assert [got.k_at(b) for b in range(1, 60)] == [_brute(schedule, b) for b in range(1, 60)]


class _Recording(ScheduledK):
    """The schedule policy, recording (batch size, drafted per request, verified per request) each step."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: list[tuple[int, list[int], list[int]]] = []
        self.skipped: list[int] = []

    def draft_limits(self, load, lag, remaining):
        limits = super().draft_limits(load, lag, remaining)
        if not any(limits):
            self.skipped.append(load.num_requests)
        return limits

    def num_verify(self, batch, load):
        plan = super().num_verify(batch, load)
        self.seen.append((load.num_requests, batch.num_drafted.tolist(), plan.num_verify.tolist()))
        return plan


def test_engine_applies_the_schedule_at_each_batch_size_and_stays_lossless(pair):
    _, _, target, draft = pair
    sched = [(1, 1, 3), (2, 3, 1), (4, 8, 0)]
    policy = _Recording(BatchSchedule(tuple(sched)), k=3)
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=12)
    prompts = [[5 + i, 17, 33 + i, 9] for i in range(6)]
    cfg = EngineConfig(k=3, concurrency=6, max_len=40)
    # arrivals: 1 alone, then 2 more (batch 3), then 3 more (batch 6): every range is visited
    engine = Engine(target, draft, cfg, policy=policy)
    forwards, real = [0], engine.drafter._forward
    engine.drafter._forward = lambda *a, **kw: (forwards.__setitem__(0, forwards[0] + 1), real(*a, **kw))[1]
    out = {f"r{i}": [] for i in range(6)}
    arrive = {0: [0], 3: [1, 2], 6: [3, 4, 5]}
    step, off = 0, []  # off: drafter forwards in each step the schedule skipped
    while step in arrive or engine.has_unfinished() or any(s > step for s in arrive):
        for i in arrive.get(step, []):
            engine.add_request(Request(f"r{i}", prompts[i], sampling))
        before, skipped = forwards[0], len(policy.skipped)
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
        if len(policy.skipped) > skipped:
            off.append(forwards[0] - before)
        step += 1
    assert {b for b, _, _ in policy.seen} >= {1, 2, 3} and policy.skipped and min(policy.skipped) >= 4
    assert off and set(off) == {0}  # K = 0: the drafter is not run, not even to keep its cache in sync
    assert policy.seen[-1][0] < 4  # ... and drafts again as the batch drains: the lazy catch-up ran
    for b, drafted, verified in policy.seen:
        k = _brute(sched, b)
        assert k > 0 and max(drafted) <= k, (b, drafted)
        assert verified == [min(d, k) for d in drafted]
    ref = Engine(target, None, EngineConfig(k=0, concurrency=6, max_len=40))
    want = ref.generate([Request(f"r{i}", p, sampling) for i, p in enumerate(prompts)])
    assert [out[g.request_id] for g in want] == [g.output_ids for g in want]


def _price(rule: CatchUpRule, lag: int) -> float:
    """The catch-up price by hand: free up to FREE_LAG, else the prefill of lag - 1 tokens, linear between the
    curve's points, the last segment's slope past them, a draft pass of that many rows below them."""
    fed, c = lag - 1, rule.cost
    if lag <= FREE_LAG:
        return 0.0
    if fed < c.prefill_tokens[0]:
        return _lin(fed, c.draft_requests, c.draft_ms)
    return _lin(fed, c.prefill_tokens, c.prefill_ms)


def _saving(rule: CatchUpRule, b: int) -> float:
    c, s = rule.concurrency, rule.saving_ms
    if b <= c[0]:
        return s[0]
    for c0, c1, s0, s1 in zip(c, c[1:], s, s[1:]):
        if b <= c1:
            return s0 + (s1 - s0) * (b - c0) / (c1 - c0)
    return s[-1]


@pytest.mark.parametrize("seed", range(10))
def test_catch_up_rule_is_the_brute_force_loop(seed):
    rng = random.Random(seed)
    conc = sorted(rng.sample(range(1, 30), rng.randint(1, 5)))
    grid = sorted(rng.sample(range(1, 600), rng.randint(2, 5)))
    prices = sorted(rng.uniform(0, 2000) for _ in grid)
    rule = _rule(conc, [rng.uniform(-5, 60) for _ in conc], grid, prices, accepted=[rng.uniform(0, 3) for _ in conc])
    lag = [rng.randint(0, 900) for _ in range(200)]
    remaining = [rng.randint(0, 200) for _ in range(200)]
    for b in range(1, 35):
        want = [x <= FREE_LAG or _price(rule, x) <= r * _saving(rule, b) + 1e-9 for x, r in zip(lag, remaining)]
        assert rule.drafts(lag, remaining, b).tolist() == want, b
        k = rng.randint(1, 5)
        sub = rng.sample(range(200), b)  # a batch of b of those requests
        got = rule.plan([lag[i] for i in sub], [remaining[i] for i in sub], b, k).tolist()
        ok = [want[i] for i in sub]
        m = sum(ok)
        a = min(float(np.interp(b, rule.concurrency, rule.accepted)), k)
        c = rule.cost
        pays = (b + m * a) / (_lin(b + m * k, c.verify_tokens, c.verify_ms)
                              + k * _lin(m, c.draft_requests, c.draft_ms)) > 1.05 * b / _lin(
            b, c.verify_tokens, c.verify_ms)  # the step check's 5% margin
        assert got == (ok if m in (0, b) or pays else [False] * b), (b, m, k)
    back = CatchUpRule.from_json(json.loads(json.dumps(rule.to_json())))
    assert back.drafts(lag, remaining, 3).tolist() == rule.drafts(lag, remaining, 3).tolist() and back == rule
    with pytest.raises(ConfigError, match="catch_up must be an object of lists"):
        CatchUpRule.from_json({"concurrency": [1]}, "f.json")
    old = {**{n: list(getattr(rule, n)) for n in ("concurrency", "saving_ms", "accepted")},
           **{n: list(getattr(rule.cost, n)) for n in ("prefill_tokens", "prefill_ms", "verify_tokens", "verify_ms",
                                                       "draft_requests", "draft_ms")}}  # files with copied curves
    assert CatchUpRule.from_json(old).drafts(lag, remaining, 3).tolist() == rule.drafts(lag, remaining, 3).tolist()
    with pytest.raises(ConfigError, match=r"f.json: prefill needs equal"):
        CatchUpRule.from_json({**old, "prefill_ms": [1.0]}, "f.json")


def _lin(x: float, xs, ys) -> float:
    """Linear interpolation by hand, the last segment's slope beyond the points, the first value below."""
    if x <= xs[0]:
        return ys[0]
    for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1] + (ys[-1] - ys[-2]) * (x - xs[-1]) / (xs[-1] - xs[-2])


def _rule(conc, saving, grid, prices, accepted=None, verify_ms=(100.0, 110.0, 200.0), draft_ms=(40.0, 45.0, 80.0)):
    """A catch-up rule over a small cost table: verify at 1, 4, 16 tokens, a draft pass at 1, 4, 16 requests."""
    cost = CostTable((1, 4, 16), tuple(verify_ms), (1, 4, 16), tuple(draft_ms), prefill_tokens=tuple(grid),
                     prefill_ms=tuple(prices))
    return CatchUpRule(tuple(conc), tuple(saving), tuple(accepted or [1.0] * len(conc)), cost)


class _Lags(ScheduledK):
    """The schedule policy, recording what the engine gives `draft_limits` and what it returns."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls: list[tuple[int, list[int], list[int], list[int]]] = []

    def draft_limits(self, load, lag, remaining):
        limits = super().draft_limits(load, lag, remaining)
        self.calls.append((load.num_requests, list(lag), list(remaining), limits))
        return limits


@pytest.mark.parametrize("saving, drafts", [(0.0, False), (1e6, True), (30.0, None)])
def test_engine_applies_the_catch_up_rule(pair, saving, drafts):
    """K = 3 alone, 0 from two requests: the first request drafts from its prompt on iff the rule lets it; the
    second arrives at batch 2 (K = 0); when the first finishes, it is back alone with a long lag."""
    _, _, target, draft = pair
    rule = _rule((1, 2), (saving, saving), (4, 64), (40.0, 640.0))  # 10 ms per token of lag
    policy = _Lags(BatchSchedule(((1, 1, 3), (2, 4, 0)), catch_up=rule), k=3)
    engine = Engine(target, draft, EngineConfig(k=3, concurrency=2, max_len=80), policy=policy)
    forwards, real = [0], engine.drafter._forward
    engine.drafter._forward = lambda *a, **kw: (forwards.__setitem__(0, forwards[0] + 1), real(*a, **kw))[1]
    prompts = [[5, 17, 33, 9, 4, 8, 21, 2], [6, 18, 34, 10, 3]]
    sampling = [SamplingConfig(temperature=0.0, max_new_tokens=n) for n in (30, 26)]
    out = {"r0": [], "r1": []}
    engine.add_request(Request("r0", prompts[0], sampling[0]))
    step = 0
    while engine.has_unfinished():
        if step == 2:
            engine.add_request(Request("r1", prompts[1], sampling[1]))
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
        step += 1
    assert policy.calls[0][1] == [len(prompts[0])]  # a new request lacks its whole prompt in the drafter
    for b, lag, remaining, limits in policy.calls:
        want = [(3 if x <= FREE_LAG or 10.0 * (x - 1) <= r * saving else 0) if b == 1 else 0
                for x, r in zip(lag, remaining)]
        assert limits == want, (b, lag, remaining, limits)
    last_pair = max(i for i, c in enumerate(policy.calls) if c[0] == 2)
    first, back = policy.calls[0], policy.calls[last_pair + 1]  # r0 new; r1 alone after steps without drafting
    assert back[0] == 1 and back[1][0] > len(prompts[1]) + 2, back  # its lag: prompt + tokens decoded meanwhile
    if drafts is False:
        assert forwards[0] == 0
    if drafts is True:
        assert first[3] == [3] and back[3] == [3]
    if drafts is None:  # 30 ms per token saved: the prompt (8 x 10 ms <= 10 x 30) drafts; the late lag,
        assert first[3] == [3] and back[3] == [0]  # over few remaining tokens, does not
    ref = Engine(target, None, EngineConfig(k=0, concurrency=2, max_len=80))
    want = ref.generate([Request(f"r{i}", p, s) for i, (p, s) in enumerate(zip(prompts, sampling))])
    assert [out[g.request_id] for g in want] == [g.output_ids for g in want]


def test_registry_and_k_check():
    policy = POLICIES.make("schedule", schedule=BatchSchedule(((1, 2, 4), (3, 9, 2))), k=4)
    assert policy.name == "schedule" and policy.schedule.k_at(100) == 2
    with pytest.raises(ConfigError, match="K=4 at batch size 1 is more than the engine drafts"):
        POLICIES.make("schedule", schedule=BatchSchedule(((1, 2, 4),)), k=3)
    drafted = torch.tensor([3, 1, 0])
    got = policy.num_verify(DraftBatch({}, drafted), Load(3, 3, 3))
    assert got.num_verify.tolist() == [2, 1, 0] and got.confidences is None


@pytest.mark.parametrize("content, message", [
    (None, "--schedule {p}: no such file"),
    ("{not json", "--schedule {p}: not valid JSON (Expecting property name enclosed in double quotes: "
                  "line 1 column 2 (char 1))"),
    ('{"x": 1}', "--schedule {p}: neither `avkit tune` results (schedule.ranges) nor a vLLM speculative_config "
                 "with num_speculative_tokens_per_batch_size"),
    ('{"schedule": {"ranges": [[1, 4, 2], [6, 9, 1]]}}',
     "{p}: num_speculative_tokens_per_batch_size[1]: starts at 6, expected 5 (ranges start at 1, contiguous, "
     "sorted)"),
    ('{"speculative_config": {"num_speculative_tokens_per_batch_size": [[1, 4, -1]]}}',
     "{p}: num_speculative_tokens_per_batch_size[0] K must be an integer >= 0, got -1"),
    ('{"schedule": {"ranges": [[1, 4]]}}',
     "--schedule {p}: ranges must be a list of (batch_lo, batch_hi, K), got [[1, 4]]"),
    ('{"schedule": {"ranges": [[1, 4, 2.5]]}}',
     "--schedule {p}: range bounds and K must be integers, got [[1, 4, 2.5]]"),
    ('{"schedule": {"ranges": [[1, 4, 9]]}}',
     "--schedule {p}: K=9 at batch size 1 is more than the engine drafts (k=7); raise -k or lower the schedule"),
])
def test_serve_bad_schedule_file_is_one_line_exit_2(tmp_path, capsys, content, message):
    p = tmp_path / "schedule.json"
    if content is not None:
        p.write_text(content)
    argv = ["serve", "--target", "/nonexistent/model", "--snapshot", str(tmp_path / "snap.json"),
            "--policy", "schedule", "--schedule", str(p), "-k", "7"]
    with pytest.raises(SystemExit) as exit_info:
        app(argv, prog_name="avkit")
    assert exit_info.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == [f"avkit: error: {message.format(p=p)}"]


@pytest.mark.parametrize("args", [["--policy", "schedule"], ["--schedule", "x.json"]])
def test_serve_schedule_option_goes_with_the_policy(tmp_path, capsys, args):
    argv = ["serve", "--target", "/nonexistent/model", "--snapshot", str(tmp_path / "snap.json"), *args]
    with pytest.raises(SystemExit) as exit_info:
        app(argv, prog_name="avkit")
    assert exit_info.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("avkit: error: --schedule FILE goes with --policy schedule")
