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
    return subprocess.run([sys.executable, "bench/live.py", "cost", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=900)


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
