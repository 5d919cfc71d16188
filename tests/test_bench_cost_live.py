"""`bench/live.py cost` run as a user runs it (a subprocess; tests import no bench script), on tiny random models:
it writes its per-step log beside the table, the table's medians are those of the logged steps, and
`--replay LOG` recomputes the same table from the log alone (no models)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from avkit.scheduling.cost import CostTable

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's avkit, whatever is installed


def _cost(*args: str) -> subprocess.CompletedProcess:
    # one torch thread: on tiny models a second one only adds contention (~5x the wall time on a loaded 2-core box)
    return subprocess.run([sys.executable, "bench/live.py", "cost", *args], cwd=ROOT, env={**ENV, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=900)


def _cells(md: Path) -> list[list[str]]:
    return [line.strip("|").split("|") for line in md.read_text().splitlines() if line.startswith("| 0 ")]


def test_tiny_grid_logs_every_step_and_replays_to_the_same_table(tmp_path):
    out = tmp_path / "cost.md"
    p = _cost("--tiny", "--temperatures", "0", "--batches", "1,2", "--ks", "0,2", "--min-tokens", "24",
              "--min-steps", "8", "--out", str(out), "--learned", str(tmp_path / "live"))
    assert p.returncode == 0, p.stderr[-3000:]
    log = out.with_name("cost_steps.jsonl")
    assert log.stat().st_size < 1_000_000
    head, *steps = [json.loads(line) for line in log.read_text().splitlines()]
    table = CostTable.from_json(head["table"])
    cells = _cells(out)
    assert [tuple(int(c) for c in row[1:3]) for row in cells] == [(1, 0), (1, 2), (2, 0), (2, 2)]
    for row in cells:
        b, k = int(row[1]), int(row[2])
        mine = [s for s in steps if (s["batch"], s["K"]) == (b, k)]
        seen = [s for s in mine if s["learned"]]
        assert [s["i"] for s in mine] == list(range(len(mine))) and int(row[3]) == len(mine) and seen
        assert int(row[4].split()[0]) == len(seen) and all(s["n"] <= b and s["passes"] <= k for s in mine)
        for s in mine[:5]:  # the offline price is the logged table's price of the logged shape
            assert s["offline_ms"] == pytest.approx(float(table.step_cost(
                s["n"], s["passes"], s["tokens"], s["context"], s["rows"], s.get("lookups", 0))), abs=1e-4)
        for col, j in (("offline_ms", 5), ("online_ms", 6)):  # the table's medians, recomputed from the log
            assert float(row[j]) == pytest.approx(np.median([s["ms"] / s[col] for s in seen]), rel=2e-3, abs=2e-3)
    replayed = tmp_path / "replay.md"
    p = _cost("--replay", str(log), "--min-steps", "8", "--out", str(replayed), "--learned", str(tmp_path / "replay"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert _cells(replayed) == cells  # the unchanged learner on the logged steps: the live table exactly
    live, again = (CostTable.load(tmp_path / d / "cost_learned_T0.json") for d in ("live", "replay"))
    assert live.to_json() == again.to_json()  # and the same learned model, a cost file every --cost reads
    assert live.to_json() != table.to_json()  # (which moved from its prior)


def test_replay_of_a_file_that_is_no_step_log_is_one_error_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"T": 0, "batch": 1}\n')
    p = _cost("--replay", str(bad))
    assert p.returncode == 2 and p.stderr.startswith("avkit: error: --replay ") and str(bad) in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_visit_replay_scores_the_depths_the_learner_never_saw(tmp_path):
    """`--replay LOG --visit 2`: a learner fed batch-1 steps of depth 2 alone, no probes, scores depths 0 and 5
    on all their steps (the learner saw none): the offline column is the brute-force median of the logged
    table's price / ms (1 / the scale the steps were timed at, within their 5% noise); no probe, no probe time."""
    table = CostTable((1, 2, 4, 8), (10.0, 12.0, 14.0, 20.0), (1, 2), (3.0, 4.0), meta={"source": "test"})
    rng = np.random.default_rng(0)
    steps, scale = [], {0: 1.0, 2: 1.5, 5: 0.8}
    for k in (0, 2, 5):
        for i in range(40):
            ms = float(table.step_cost(1, k, k + 1, 100 + i, 1)) * scale[k] * (1 + 0.05 * rng.standard_normal())
            steps.append({"T": 0.0, "batch": 1, "K": k, "i": i, "n": 1, "passes": k, "tokens": k + 1,
                          "context": 100 + i, "rows": 1, "ms": round(ms, 4)})
    log = tmp_path / "steps.jsonl"
    log.write_text("".join(json.dumps(d) + "\n" for d in [{"T": 0.0, "table": table.to_json()}, *steps]))
    out = tmp_path / "visit.md"
    p = _cost("--replay", str(log), "--visit", "2", "--visit-steps", "40", "--probe-every", "0", "--out", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {int(r[1]): r for r in _cells(out)}
    assert sorted(rows) == [0, 5] and "T = 0 0.000, " in out.read_text()
    for k in (0, 5):
        mine = [d for d in steps if d["K"] == k]
        oracle = np.median([float(table.step_cost(1, k, k + 1, d["context"], 1)) / d["ms"] for d in mine])
        assert int(rows[k][2]) == len(mine) and float(rows[k][3]) == pytest.approx(oracle, abs=1e-3)
        assert float(rows[k][3]) == pytest.approx(1 / scale[k], rel=0.05)
