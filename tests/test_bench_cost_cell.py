"""`bench/live.py cost --cell` (bench/cost_cell.py) run as a user runs it (a subprocess; tests import no bench
script) on a live cell's steps drawn from a known truth: the table today's learner fits to repeats 0-1 prices
repeat 2 as the truth does, and the drift table reports the slowdown repeat 2 was given."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from avkit.scheduling.cost import CostTable

ROOT = Path(__file__).resolve().parents[1]
TRUE = CostTable((1, 2, 4, 8, 16), (100.0, 120.0, 150.0, 250.0, 450.0), (1, 2, 4), (40.0, 45.0, 55.0),
                 context_len=350, kv_ms_per_token=0.05, meta={"k": 7, "source": "truth"})
# the prior is off as a profile of another session is: every step 25% dear, no KV slope
PRIOR = CostTable(TRUE.verify_tokens, tuple(1.25 * v for v in TRUE.verify_ms), TRUE.draft_requests,
                  tuple(1.25 * v for v in TRUE.draft_ms), context_len=350, meta={"k": 7, "source": "profile"})
DEPTHS = {"fixed:1": [1], "fixed:3": [3], "adaptive-stop:online_logistic": [3, 4, 5]}  # passes each policy runs
SLOW = 1.10  # repeat 2 ran on a box 10% slower (the drift no table learned from repeats 0-1 can know)


def _steps(path: Path) -> None:
    rng = np.random.default_rng(0)
    lines = []
    for rep in range(3):
        for policy, depths in DEPTHS.items():
            for i in range(60):
                p, context = depths[i % len(depths)], 300 + 2 * i
                ms = float(TRUE.step_cost(1, p, p + 1, context)) * (1 + 0.02 * rng.standard_normal())
                lines.append({"policy": policy, "repeat": rep, "num_requests": 1, "passes": p, "tokens": p + 1,
                              "context_tokens": context, "ms": ms * (SLOW if rep == 2 else 1.0), "draft_rows": None,
                              "lookups": 0, "catch_up": [], "drafting_ms": None})
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))


def test_cell_steps_learned_from_two_repeats_price_the_third_as_the_truth(tmp_path):
    steps = tmp_path / "synthetic_T0_c1.steps.jsonl"  # no kept table or trace beside it: those sections are left out
    _steps(steps)
    PRIOR.save(tmp_path / "prior.json")
    out = tmp_path / "cell.md"
    p = subprocess.run([sys.executable, "bench/live.py", "cost", "--cell", str(steps), "--cost",
                        str(tmp_path / "prior.json"), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.read_text().splitlines()
            if line.startswith("| ")]
    names = next(r for r in rows if r[:3] == ["policy", "steps", "measured ms"])[3:]  # the tables, in order
    held = {r[0]: dict(zip(names, map(float, r[3:]))) for r in rows if len(r) == 3 + len(names) and r[0] in DEPTHS}
    drift = {r[0]: float(r[4]) for r in rows if len(r) == 5 and r[0] in DEPTHS}
    assert set(held) == set(DEPTHS) == set(drift) and names == ["prior", "adaptive r0-1", "carried r0-1", "all r0-1"]
    for policy, h in held.items():
        prior, adaptive, chained, every = (h[n] for n in names)
        # repeat 2 is SLOW x the truth: a table that learned the truth prices it 1 / SLOW (2% step noise: +-3%)
        assert abs(every * SLOW - 1) < 0.03, (policy, every)
        assert prior * SLOW > 1.15, (policy, prior)  # the prior alone does not
        if policy != "fixed:1":  # the adaptive policy's depths: its own steps teach them; depth 1 it never ran
            assert abs(adaptive * SLOW - 1) < 0.03 and abs(chained * SLOW - 1) < 0.03, (policy, adaptive, chained)
        assert abs(drift[policy] - (SLOW - 1)) < 0.02, (policy, drift[policy])
