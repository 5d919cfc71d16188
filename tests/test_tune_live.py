"""bench/tune_live.py, the mixed-load runner of issue 19 item 5, on tiny random models (fast, CI).

The plan's arrivals move the batch across every range of the schedule; every config of the avkit phase
decodes every request to its own length; at T = 0 the speculative and scheduled configs give the no-spec
output token for token; tokens/s is tokens over wall time; pieces merge into one results file and the
report states a verdict per run. Timings are not checked (bench/ holds those)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

import tune_live
from tune_live_report import write_report

from avkit.models import Tokenizer
from avkit.scheduling.batch_schedule import BatchSchedule

SCHEDULE = BatchSchedule(((1, 1, 2), (2, 3, 1), (4, 6, 0)))


def _args(pair, **kw) -> argparse.Namespace:
    tpath, dpath, _, _ = pair
    base = dict(concurrency="1,4", bursts="1@0,2@6,3@14", mixed_new="6,14", max_new_tokens=8, seed=0,
                datasets=["humaneval", "sharegpt"], temperature=0.0, tiny=True, ks="1,2", configs="",
                target_dir=str(tpath), draft_dir=str(dpath), dtype="float32", runs="", budget_s=0.0)
    return argparse.Namespace(**{**base, **kw})


def test_plan_visits_every_range_and_runs_every_config(pair, tmp_path):
    args = _args(pair)
    runs = tune_live.plan(args, Tokenizer.from_dir(Path(args.target_dir)))
    assert [r["name"] for r in runs] == ["c=1", "c=4", "mixed"]
    mixed = runs[-1]
    assert mixed["arrival_tokens"] == [0, 6, 6, 14, 14, 14] and all(6 <= n <= 14 for n in mixed["max_new"])
    assert runs[0]["arrival_tokens"] == [0, 8]  # c=1: the second request once the first is done
    cfgs = tune_live.configs(args, SCHEDULE)
    assert [c[0] for c in cfgs] == ["nospec", "K=1", "K=2", "tuned"] and cfgs[-1][1] == SCHEDULE.max_k
    rows = tune_live.avkit_phase(args, runs, cfgs, SCHEDULE)
    assert len(rows) == len(runs) * len(cfgs)
    by = {(x["config"], x["run"]): x for x in rows}
    for r in runs:
        for name, _, _ in cfgs:
            x = by[name, r["name"]]
            assert [len(o) <= n for o, n in zip(x["outputs"], r["max_new"])] == [True] * len(r["prompts"])
            assert x["tok_s"] == pytest.approx(x["tokens"] / x["wall_s"]) and x["tokens"] > 0
            assert x["outputs"] == by["nospec", r["name"]]["outputs"]  # lossless at T = 0
    visited = {SCHEDULE.k_at(b) for b in by["tuned", "mixed"]["in_flight"]}
    assert visited == {0, 1, 2}, by["tuned", "mixed"]["in_flight"]  # every range of the schedule
    assert max(by["tuned", "c=1"]["in_flight"]) == 1 and set(by["tuned", "c=4"]["in_flight"]) >= {4}

    out = tmp_path / "live.json"
    meta = {"argv": ["tune_live.py"], "utc": "t", "uptime_start": "u", "schedule_file": "s",
            "schedule": [list(x) for x in SCHEDULE.ranges], "plan": runs}
    tune_live.merge(out, meta, rows[:3])
    data = tune_live.merge(out, meta, rows)  # the second piece replaces the rows it measured again
    assert len(data["rows"]) == len(rows) and len(data["pieces"]) == 2
    text = write_report(data, tmp_path / "live.md")
    verdicts = [ln for ln in text.splitlines() if ln.startswith("- avkit ") and " tuned " in ln and "goal" in ln]
    assert len(verdicts) == len(runs) and all("meets the goal" in v or "MISSES the goal" in v for v in verdicts)
    assert "| c=1 | " in text and "steps per batch-size range: 1-1 (K=2): " in text
