"""`bench/tune.py live`, the live check of `avkit tune`'s schedule, run as a user runs it (a subprocess; tests
import no bench script) on tiny random models (fast, CI).

The plan's arrivals move the batch across every range of the schedule; every config of the avkit phase
decodes every request to its own length; at T = 0 the speculative and scheduled configs give the no-spec
output token for token; tokens/s is tokens over wall time; repeated rounds keep the median round; pieces
merge into one results file and `--report` states a verdict per run. Timings are not checked (bench/ holds
those)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from avkit.runtime.step_log import steady_tok_s
from avkit.scheduling.batch_schedule import BatchSchedule

ROOT = Path(__file__).resolve().parents[1]
SCHEDULE = BatchSchedule(((1, 1, 2), (2, 3, 1), (4, 6, 0)))
SMALL = ["--tiny", "--concurrency", "1,4", "--bursts", "1@0,2@6,3@14", "--mixed-new", "6,14", "--max-new-tokens", "8",
         "--ks", "1,2"]


def _live(tmp_path, *argv: str) -> dict:
    """`python bench/tune.py live ARGV --out tmp/live.json` with the test schedule -> the results JSON."""
    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"num_speculative_tokens_per_batch_size": [list(r) for r in SCHEDULE.ranges]}))
    out = tmp_path / "live.json"
    p = subprocess.run([sys.executable, "bench/tune.py", "live", "--schedule", str(schedule), "--vllm-schedule",
                        str(schedule), "--out", str(out), *argv], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


def _report(tmp_path, data: dict) -> str:
    """`python bench/tune.py live --report` on `data` (a results JSON) -> the Markdown it writes."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    p = subprocess.run([sys.executable, "bench/tune.py", "live", "--report", "--out", str(path)], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return path.with_suffix(".md").read_text()


def test_plan_visits_every_range_and_runs_every_config(tmp_path):
    data = _live(tmp_path, *SMALL, "--engines", "avkit")
    runs, rows = data["plan"], data["rows"]
    assert [r["name"] for r in runs] == ["c=1", "c=4", "mixed"]
    mixed = runs[-1]
    assert mixed["arrival_tokens"] == [0, 6, 6, 14, 14, 14] and all(6 <= n <= 14 for n in mixed["max_new"])
    assert runs[0]["arrival_tokens"] == [0, 8]  # c=1: the second request once the first is done
    configs = ["nospec", "K=1", "K=2", "tuned"]
    assert len(rows) == len(runs) * len(configs) and {x["piece"] for x in rows} == {data["pieces"][0]["utc"]}
    by = {(x["config"], x["run"]): x for x in rows}
    for r in runs:
        for name in configs:
            x = by[name, r["name"]]
            assert [len(o) <= n for o, n in zip(x["outputs"], r["max_new"])] == [True] * len(r["prompts"])
            assert x["tok_s"] == pytest.approx(x["tokens"] / x["wall_s"]) and x["tokens"] > 0
            assert x["outputs"] == by["nospec", r["name"]]["outputs"]  # lossless at T = 0
    assert by["nospec", "mixed"]["steady_tok_s"] is None  # arrivals spread: no steady window
    assert by["nospec", "c=4"]["steady_tok_s"] is not None and len(by["nospec", "c=4"]["steps"]) == \
        len(by["nospec", "c=4"]["in_flight"])  # one [seconds, tokens, started, finished] per engine step
    visited = {SCHEDULE.k_at(b) for b in by["tuned", "mixed"]["in_flight"]}
    assert visited == {0, 1, 2}, by["tuned", "mixed"]["in_flight"]  # every range of the schedule
    assert max(by["tuned", "c=1"]["in_flight"]) == 1 and set(by["tuned", "c=4"]["in_flight"]) >= {4}
    text = (tmp_path / "live.md").read_text()
    verdicts = [ln for ln in text.splitlines() if ln.startswith("- avkit ") and " tuned " in ln and "goal" in ln]
    assert len(verdicts) == len(runs) and all("meets the goal" in v or "MISSES the goal" in v for v in verdicts)
    assert "| c=1 | " in text and "steps per batch-size range: 1-1 (K=2): " in text

    again = _live(tmp_path, *SMALL, "--engines", "avkit", "--runs", "c=1", "--configs", "nospec")
    assert len(again["pieces"]) == 2 and len(again["rows"]) == len(rows)  # the second piece replaced its row
    assert by["nospec", "c=1"]["piece"] != next(x for x in again["rows"] if x["config"] == "nospec"
                                                 and x["run"] == "c=1")["piece"]


def test_waves_queue_steady_requests_and_repeated_rounds_keep_the_median(tmp_path):
    """--waves W: c=N runs W waves of N requests (HumanEval and ShareGPT alternating), wave j arriving at
    j N max_new output tokens; the batch never exceeds N and the steady rate pools every wave's window.
    --repeats 3: one row per config, the round whose steady rate is the median, every round's rates kept."""
    data = _live(tmp_path, "--tiny", "--concurrency", "1,2", "--waves", "3", "--runs", "c=2", "--max-new-tokens",
                 "8", "--ks", "1,2", "--configs", "nospec,K=2", "--engines", "avkit", "--repeats", "3")
    c2 = data["plan"][0]
    assert c2["arrival_tokens"] == [0, 0, 16, 16, 32, 32] and c2["lanes"] == 2 and len(c2["prompts"]) == 6
    assert c2["prompts"][0] != c2["prompts"][1]  # two datasets
    rows = data["rows"]
    assert [x["config"] for x in rows] == ["nospec", "K=2"]
    for x in rows:
        assert max(x["in_flight"]) == 2 and x["in_flight"].count(2) >= 3 * 2  # three waves, each decodes at 2
        assert x["steady_tok_s"] == pytest.approx(steady_tok_s(x["steps"], 2, waves=3))
        assert x["steady_tok_s"] > 0 and len(x["outputs"]) == 6 and not x["outputs_vary"]
        rates = sorted(r["steady_tok_s"] for r in x["repeats"])
        assert len(rates) == 3 and x["steady_tok_s"] == rates[1]
    assert rows[0]["outputs"] == rows[1]["outputs"]
    text = (tmp_path / "live.md").read_text()
    assert "(median kept)" in text


def _row(engine: str, config: str, run: str, tok_s: float, steady: float | None = None) -> dict:
    return {"engine": engine, "config": config, "run": run, "tokens": 10, "wall_s": 10 / tok_s, "tok_s": tok_s,
            "steady_tok_s": steady,
            "in_flight": [1, 2, 1], "outputs": [[1, 2]], "outside": 0.0, "uptime": "load average: 0.00"}


def test_a_schedule_that_is_speculation_off_is_the_nospec_config(tmp_path):
    """The tuner's "off" (speculative_config null) runs once, as no-spec, and is judged against every
    speculative fixed K, on tok/s incl. prefill: ahead of all of them on the mixed run, >= 0.97x the best at a
    steady one, where steady decode tok/s (what the tuner predicts) is compared beside it."""
    plan = [{"name": n, "prompts": [[1]], "max_new": [2], "arrival_tokens": [0]} for n in ("c=1", "mixed")]
    rows = [_row("vllm", "nospec", "c=1", 2.50, 2.56), _row("vllm", "K=1", "c=1", 2.40, 2.70),
            _row("vllm", "K=3", "c=1", 2.60, 2.50),
            _row("vllm", "nospec", "mixed", 4.0), _row("vllm", "K=1", "mixed", 3.9), _row("vllm", "K=3", "mixed", 4.1)]
    data = {"plan": plan, "rows": rows, "pieces": [{"argv": ["x"], "utc": "t", "uptime_start": "u"}],
            "schedules": {"vllm": {"file": "f", "ranges": [[1, 1, 0]]}}}
    lines = [ln for ln in _report(tmp_path, data).splitlines()
             if ln.startswith("- vllm ") and "goal" in ln]
    # the verdict is on the whole run (both prefills in): 2.50 against K=3's 2.60
    assert lines[0].startswith("- vllm c=1: tuned (= nospec) 2.50 tok/s incl. prefill = 0.962x the best "
                               "speculative fixed (K=3, 2.60")
    assert "MISSES" in lines[0] and "2 fixed configs" in lines[0]
    # and steady decode beside it (the tuner's state): 2.56 against K=1's 2.70
    assert lines[0].endswith("; steady decode 2.56 tok/s = 0.948x the best (K=1, 2.70; 2 with a window): misses")
    assert "steady decode" not in lines[1]  # the mixed run has no steady window
    assert "1.000x" not in lines[1] and "MISSES" in lines[1]  # 4.0 < K=3's 4.1: not ahead of every fixed K
    rows[-1]["tok_s"], rows[2]["tok_s"], rows[1]["steady_tok_s"] = 3.95, 2.55, 2.62
    lines = [ln for ln in _report(tmp_path, data).splitlines() if " goal " in ln]
    assert "0.980x" in lines[0] and "meets the goal" in lines[0]  # 2.50 / 2.55
    assert "= 0.977x the best (K=1, 2.62" in lines[0] and lines[0].endswith(": meets")  # 2.56 / 2.62
    assert "tok/s incl. prefill = 1.013x" in lines[1] and "meets the goal" in lines[1]


def test_the_median_round_is_reported_with_every_rounds_rate(tmp_path):
    rounds = [_row("avkit", "K=1", "c=4", t, s) for t, s in ((9.0, 30.0), (8.0, 33.0), (10.0, 31.0))]
    x = {**rounds[2], "repeats": [{f: r[f] for f in ("tok_s", "steady_tok_s", "wall_s", "uptime")} for r in rounds],
         "outputs_vary": False}  # the row `tune.py live` keeps: the round of median steady rate
    plan = [{"name": "c=4", "prompts": [[1]], "max_new": [2], "arrival_tokens": [0]}]
    data = {"plan": plan, "rows": [x], "pieces": [], "schedules": {"avkit": {"file": "f", "ranges": [[1, 4, 1]]}}}
    assert "rounds 30.00, 33.00, 31.00 (median kept)" in _report(tmp_path, data)


@pytest.mark.vllm
def test_vllm_peer_runs_the_output_token_clock(tmp_path, monkeypatch):
    """vLLM gets the same plan as avkit: requests arrive by tokens emitted (or once the engine is idle), so
    c=1 decodes one request at a time and the mixed run's batch grows to every burst; each request stops at
    its own new-token count (vLLM's Dynamic SD schedule itself: tests/test_vllm_record.py)."""
    from vllm_support import need_vllm

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # conftest's, for avkit's kernels; not vLLM's business
    data = _live(tmp_path, *SMALL, "--engines", "vllm", "--vllm-python", str(need_vllm()), "--configs", "tuned")
    runs, rows = data["plan"], data["rows"]
    assert all("error" not in x for x in rows), rows
    by = {x["run"]: x for x in rows}
    assert max(by["c=1"]["in_flight"]) == 1 and len(by["c=1"]["outputs"]) == 2
    assert max(by["c=4"]["in_flight"]) == 4
    mixed = next(r for r in runs if r["name"] == "mixed")
    visited = {SCHEDULE.k_at(b) for b in by["mixed"]["in_flight"]}
    assert visited == {0, 1, 2}, by["mixed"]["in_flight"]  # every range of the schedule, as on avkit
    assert [len(o) <= n for o, n in zip(by["mixed"]["outputs"], mixed["max_new"])] == [True] * len(mixed["max_new"])
    assert sum(map(len, by["mixed"]["outputs"])) > len(mixed["max_new"])


def test_a_verdict_across_pieces_is_flagged_with_its_own_pieces_verdict(tmp_path):
    """Rows of different invocations (pieces) saw the box at different speeds: the verdict says so and, where
    the tuned row's piece measured fixed configs too, gives that piece's verdict beside it."""
    plan = [{"name": n, "prompts": [[1]], "max_new": [2], "arrival_tokens": [0]} for n in ("c=8", "mixed")]
    rows = [_row("avkit", "tuned", "c=8", 8.4), _row("avkit", "nospec", "c=8", 8.6), _row("avkit", "K=5", "c=8", 9.8),
            _row("avkit", "tuned", "mixed", 19.6), _row("avkit", "nospec", "mixed", 19.5)]
    for x, piece in zip(rows, ("b", "b", "a", "b", "b")):
        x["piece"] = piece
    data = {"plan": plan, "rows": rows, "pieces": [], "schedules": {"avkit": {"file": "f", "ranges": [[1, 8, 1]]}}}
    lines = [ln for ln in _report(tmp_path, data).splitlines() if " goal " in ln]
    assert "0.857x the best fixed (K=5, 9.80" in lines[0] and "MISSES" in lines[0]  # across pieces: 8.4 / 9.8
    assert lines[0].endswith("[rows from 2 pieces (invocations); within the tuned row's piece: 0.977x the best of "
                             "1 (nospec, 8.60): meets]")  # 8.4 / 8.6
    assert "pieces" not in lines[1]  # one piece: nothing to flag
    rows[1]["piece"] = None
    lines = [ln for ln in _report(tmp_path, data).splitlines() if " goal " in ln]
    assert lines[0].endswith("[rows from 3 pieces (invocations) (some unrecorded): no fixed config shares the tuned "
                             "row's piece]")


def test_a_tuned_run_that_drafted_nowhere_pools_with_nospec(tmp_path):
    """A tuned run whose every step sat in a K = 0 range (or whose drafter never ran, where recorded) did
    no-spec's work: both configs' rounds are pooled (lower middle) and judged against the speculative K only."""
    plan = [{"name": "c=8", "prompts": [[1]], "max_new": [2], "arrival_tokens": [0]}]

    def rounds(config, rates, **kw):
        x = _row("avkit", config, "c=8", rates[0])
        x["repeats"] = [{"tok_s": v, "steady_tok_s": None, "wall_s": 1.0, "uptime": "u", **kw} for v in rates]
        x["in_flight"] = [8, 8, 7, 6]
        return x
    rows = [rounds("tuned", [9.7, 7.7, 7.8]), rounds("nospec", [8.8, 9.1, 10.0]), rounds("K=2", [7.9, 5.9, 8.1])]
    data = {"plan": plan, "rows": rows, "pieces": [], "schedules": {"avkit": {"file": "f", "ranges": [[1, 3, 1],
                                                                                                    [4, 8, 0]]}}}
    text = _report(tmp_path, data)
    line = next(ln for ln in text.splitlines() if " goal " in ln)
    # pooled 7.7, 7.8, 8.8, 9.1, 9.7, 10.0 -> lower middle 8.8; against K=2's median 7.9, not no-spec
    assert line.startswith("- avkit c=8: tuned (drafted at no step: no-spec's work; its and no-spec's 6 rounds "
                           "pooled) 8.80 tok/s incl. prefill = 1.114x the best speculative fixed (K=2, 7.90; 1 fixed")
    assert "| c=8 | 9.10 | 7.90 | 7.80 | 1.114x |" in text  # the cells stay each config's own median
    rows[0]["in_flight"] = [8, 3, 1]  # batch 3 is in the K = 1 range: it may have drafted
    assert "(nospec, 9.10" in next(ln for ln in _report(tmp_path, data).splitlines() if " goal " in ln)
    rows[0]["in_flight"] = [8, 8, 7, 6]
    rows[0]["repeats"][1]["draft_forward_s"] = 0.5  # recorded: the drafter ran in a round (a catch-up)
    for y in rows[0]["repeats"][::2]:
        y["draft_forward_s"] = 0.0
    assert "pooled" not in _report(tmp_path, data)
    rows[0]["repeats"][1]["draft_forward_s"] = 0.0
    assert "6 rounds pooled" in _report(tmp_path, data)


def test_a_tuned_row_of_an_earlier_schedule_is_judged_only_where_it_made_the_same_decisions(tmp_path):
    """Each tuned row ran its piece's schedule (rows from before pieces: the first piece's). Re-tuning changes
    the current one: a row whose visited batch sizes all keep their K is still judged (and says so); one that
    visited a batch size whose K changed is not judged."""
    plan = [{"name": n, "prompts": [[1]], "max_new": [2], "arrival_tokens": [0]} for n in ("c=2", "c=8")]
    old, now = [[1, 1, 3], [2, 3, 1], [4, 16, 0]], [[1, 1, 3], [2, 16, 0]]
    rows = []
    for run, sizes in (("c=2", [2, 2, 1]), ("c=8", [8, 7, 6])):
        for config, tok in (("tuned", 5.0), ("nospec", 4.0), ("K=1", 3.0)):
            rows.append({**_row("avkit", config, run, tok), "in_flight": sizes, "piece": "p0"})
    pieces = [{"utc": "p0", "argv": ["x"], "uptime_start": "u", "schedules": {"avkit": {"ranges": old}}},
              {"utc": "p1", "argv": ["y"], "uptime_start": "u", "schedules": {"avkit": {"ranges": now}}}]
    data = {"plan": plan, "rows": rows, "pieces": pieces, "schedules": {"avkit": {"file": "f", "ranges": now}}}
    lines = [ln for ln in _report(tmp_path, data).splitlines() if ln.startswith("- avkit c=")]
    assert lines[0].startswith("- avkit c=2: not judged: its tuned row ran the earlier schedule [[1, 1, 3], "
                               "[2, 3, 1], [4, 16, 0]], a different K at batch sizes it visited")
    assert "(ran the earlier schedule [[1, 1, 3], [2, 3, 1], [4, 16, 0]]: the same K at every batch size it " \
           "visited) 4.00 tok/s" in lines[1] and "meets the goal" in lines[1]  # K = 0 there: pooled with no-spec
    rows[0]["piece"] = "p1"  # re-measured under the current schedule: judged, with no note
    text = _report(tmp_path, data)
    assert "- avkit c=2: tuned 5.00 tok/s incl. prefill = 1.250x the best fixed (nospec, 4.00" in text
    # a fixed config measured on another machine is left out of the verdict (a different CPU is not noise)
    pieces.append({"utc": "p2", "argv": ["z"], "uptime_start": "u", "machine": "another CPU",
                   "schedules": {"avkit": {"ranges": now}}})
    rows[2]["piece"] = "p2"  # c=2 K=1
    rows[2]["tok_s"] = 9.0
    assert "c=2: tuned 5.00 tok/s incl. prefill = 1.250x the best fixed (nospec, 4.00; 1 fixed config" \
        in _report(tmp_path, data)
    pieces[2]["machine"] = "the AVX2 box"  # the tuned row's (pieces before machines were recorded ran there):
    # the same machine, judged against it
    assert "0.556x the best fixed (K=1, 9.00" in _report(tmp_path, data)
    for x in rows:
        x.pop("piece")  # rows from before pieces were recorded ran the first piece's schedule
    assert "c=2: not judged" in _report(tmp_path, data)
