"""The `schedule` verify policy (avkit/scheduling/batch_schedule.py): K by batch size, as the tuner wrote it.

Checked against brute force: K(b) is the K of the range holding b (the last range's past it) for schedules
read from `avkit tune --out` JSON and from its vLLM fragment; in the engine, every step at batch size b
drafts at most K(b) per request, verifies min(drafted, K(b)), drafts nothing where K(b) = 0, and the
greedy output equals target-only decoding token for token. Bad schedule files are one error line, exit 2.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from avkit.cli import app
from avkit.config import EngineConfig, SamplingConfig
from avkit.errors import ConfigError
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.scheduling.batch_schedule import BatchSchedule, ScheduledK
from avkit.scheduling.policy import make_policy
from avkit.step_types import DraftBatch, Load
from avkit.tune.formats import vllm_fragment
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
    frag.write_text(json.dumps(vllm_fragment(schedule, adaptive=False)))
    for path in (tune_json, frag):
        got = BatchSchedule.load(path)
        if max(k for _, _, k in schedule) == 0:  # the fragment is `speculative_config: null`
            assert all(got.k_at(b) == 0 for b in range(1, 60))
            continue
        assert [got.k_at(b) for b in range(1, 60)] == [_brute(schedule, b) for b in range(1, 60)]


class _Recording(ScheduledK):
    """The schedule policy, recording (batch size, drafted per request, verified per request) each step."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: list[tuple[int, list[int], list[int]]] = []
        self.skipped: list[int] = []

    def draft_this_step(self, load):
        on = super().draft_this_step(load)
        if not on:
            self.skipped.append(load.num_requests)
        return on

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
    cfg = EngineConfig(k=3, max_batch=6, max_len=40)
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
    ref = Engine(target, None, EngineConfig(k=0, max_batch=6, max_len=40))
    want = ref.generate([Request(f"r{i}", p, sampling) for i, p in enumerate(prompts)])
    assert [out[g.request_id] for g in want] == [g.output_ids for g in want]


def test_registry_and_k_check():
    policy = make_policy("schedule", schedule=BatchSchedule(((1, 2, 4), (3, 9, 2))), k=4)
    assert policy.name == "schedule" and policy.schedule.k_at(100) == 2
    with pytest.raises(ConfigError, match="K=4 at batch size 1 is more than the engine drafts"):
        make_policy("schedule", schedule=BatchSchedule(((1, 2, 4),)), k=3)
    drafted = torch.tensor([3, 1, 0])
    got = policy.num_verify(DraftBatch({}, drafted), Load(3, 3, 3))
    assert got.num_verify.tolist() == [2, 1, 0] and got.confidences is None


@pytest.mark.parametrize("content, message", [
    (None, "--schedule {p}: no such file"),
    ("{not json", "--schedule {p}: not a JSON file (Expecting property name enclosed in double quotes: "
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
