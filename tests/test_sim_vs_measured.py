"""bench/sim_vs_measured.py and the steady decode rate of bench/engine_peer.py (issue 18 item 3), fast, CI.

The steady rate's window is checked against a brute-force scan of the step log; avkit's per-step log on
tiny random models adds up to the generated tokens; measured cells are taken from an engine.py JSON by
(engine, dataset, T = 0, c, K or adaptive); the table's best K is over fixed K only. Timings are not
checked (bench/ holds those)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

import engine_peer
import sim_vs_measured


def _window(steps: list[list[float]], n: int) -> tuple[float, float] | None:
    """(tokens, seconds) over every (i, j) pair: i is the first step with n started requests, j the last with
    none finished."""
    best = None
    for i in range(len(steps)):
        for j in range(i + 1, len(steps)):
            if steps[i][2] >= n and all(s[2] < n for s in steps[:i]) and steps[j][3] == 0 \
                    and all(s[3] > 0 for s in steps[j + 1:]):
                best = (steps[j][1] - steps[i][1], steps[j][0] - steps[i][0])
    return best


def _brute(steps: list[list[float]], n: int) -> float:
    w = _window(steps, n)
    return float("nan") if w is None else w[0] / w[1]


def _random_wave(rng, n: int) -> list[list[float]]:
    t, tok, started, done, steps = 0.0, 0, 0, 0, []
    for _ in range(rng.randint(1, 30)):
        t += rng.uniform(0.01, 1.0)
        started = min(n, started + rng.randint(0, 2))
        tok += started * rng.randint(1, 4)
        done = min(started, done + (rng.random() < 0.15))
        steps.append([t, float(tok), float(started), float(done)])
    return steps


@pytest.mark.parametrize("seed", range(20))
def test_steady_rate_matches_a_brute_force_window(seed):
    import random

    rng = random.Random(seed)
    n = rng.randint(1, 6)
    steps = _random_wave(rng, n)
    got, want = engine_peer.steady_tok_s(steps, n), _brute(steps, n)
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_steady_rate_of_waves_pools_each_waves_brute_force_window(seed):
    """Waves of n requests one after another (each wave ends with all its requests finished, the next starts
    after): the rate is the waves' window tokens over their window seconds, each window cut as for one wave."""
    import random

    rng = random.Random(seed)
    n, waves, steps, want = rng.randint(1, 4), rng.randint(1, 4), [], [0.0, 0.0]
    for j in range(waves):
        wave = _random_wave(rng, n)
        wave.append([wave[-1][0] + 0.5, wave[-1][1] + 1, float(n), float(n)])  # the wave drains
        if (w := _window(wave, n)) is not None:
            want = [want[0] + w[0], want[1] + w[1]]
        t0, tok0 = (steps[-1][0], steps[-1][1]) if steps else (0.0, 0.0)
        steps += [[t0 + t, tok0 + k, j * n + a, j * n + d] for t, k, a, d in wave]
    got = engine_peer.steady_tok_s(steps, n, waves=waves)
    assert (math.isnan(got) and want[1] == 0) or got == pytest.approx(want[0] / want[1], rel=1e-12)


def test_steady_rate_is_nan_without_a_window():
    assert math.isnan(engine_peer.steady_tok_s([], 2))
    assert math.isnan(engine_peer.steady_tok_s([[0.1, 2.0, 2.0, 0.0], [0.2, 4.0, 2.0, 2.0]], 2))  # one step
    assert engine_peer.steady_tok_s([[0.1, 1.0, 1.0, 0.0], [0.3, 3.0, 2.0, 0.0], [0.5, 7.0, 2.0, 0.0],
                                     [0.7, 9.0, 2.0, 1.0]], 2) == pytest.approx(4.0 / 0.2)


def test_avkit_steady_rate_counts_tokens_per_step(pair, monkeypatch):
    """A fake clock that ticks once per engine step: the steady rate is then tokens per step, exactly c
    for target-only decoding (one token per request and step) and between c and c (K + 1) with K drafts."""
    import types

    ticks = iter(range(10_000))
    monkeypatch.setattr(engine_peer, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    tpath, dpath, _, _ = pair
    args = argparse.Namespace(target_dir=str(tpath), draft_dir=str(dpath), dtype="float32", adaptive=False,
                              coefficients="")
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12]]
    runs = [{"name": "x c=3", "dataset": "humaneval", "temperature": 0.0, "top_p": 1.0, "c": 3,
             "prompts": prompts, "max_new_tokens": 12, "seed": 0}]
    got = engine_peer.avkit_phase(args, [0, 3], runs, None)
    assert got[("x c=3", "K=0")]["steady_tok_s"] == 3.0
    assert 3.0 < got[("x c=3", "K=3")]["steady_tok_s"] <= 12.0
    assert got[("x c=3", "K=3")]["outputs"] == got[("x c=3", "K=0")]["outputs"]  # float32: lossless greedy


def _cell(engine, c, config, steady, e2e, dataset="humaneval", T=0.0):
    k = int(config[2:]) if config.startswith("K=") else None
    return {"engine": engine, "run": f"{dataset} T={T:g} c={c}", "dataset": dataset, "T": T, "c": c,
            "config": config, "K": k, "tok_s": e2e, "steady_tok_s": steady, "load": 1.0, "max_new_tokens": 64}


def test_cells_are_taken_by_engine_dataset_greedy_c_and_k(tmp_path):
    cells = [_cell("vllm", 1, "K=0", 2.0, 1.5), _cell("vllm", 1, "K=3", 2.4, 1.8),
             _cell("vllm", 1, "K=3", 9.0, 9.0, T=1.0),  # sampled: not a greedy cell
             _cell("avkit", 1, "K=3", 7.0, 7.0), _cell("avkit", 1, "adaptive", 5.0, 4.0),
             _cell("vllm", 4, "K=0", None, 3.0)]  # no steady window: left out
    path = tmp_path / "cells.json"
    path.write_text(json.dumps({"cells": cells}))
    got = sim_vs_measured.from_cells(str(path), "vllm", ["humaneval"], [0, 3], [1, 4])
    assert set(got) == {(1, 0), (1, 3)}
    assert got[(1, 3)]["tok_s"] == 2.4 and got[(1, 3)]["e2e"] == 1.8 and got[(1, 3)]["max_new_tokens"] == 64
    ada = sim_vs_measured.from_cells(str(path), "avkit", ["humaneval"], [3, "adaptive"], [1])
    assert ada[(1, "adaptive")]["tok_s"] == 5.0 and ada[(1, 3)]["tok_s"] == 7.0
    assert sim_vs_measured.from_cells(str(path), "vllm", ["humaneval", "sharegpt"], [0], [1]) == {}


def test_table_picks_the_best_fixed_k_and_shows_adaptive_beside_it():
    base = {"engine": "avkit", "c": 1, "when": "now", "trace": "t", "cost": "c", "datasets": ["humaneval"],
            "max_new_tokens": 64, "dtype": "bfloat16", "load": 1.0, "e2e": 1.0}
    cells = [{**base, "K": 0, "predicted": 2.0, "measured": 2.1}, {**base, "K": 3, "predicted": 2.5, "measured": 2.2},
             {**base, "K": "adaptive", "predicted": 9.0, "measured": 9.0, "policy": "adaptive-stop:online_logistic"}]
    text = sim_vs_measured.render(sorted(cells, key=sim_vs_measured._k_order))
    assert "simulator's best K = 3, measured best K = 3 (agree; over K = [0, 3])" in text
    assert "| 1 | adaptive (`adaptive-stop:online_logistic`) | 9.00 | 9.00 | 1.00 | 4.50 | 4.29 |" in text


@pytest.mark.parametrize("seed", range(6))
def test_first_tokens_keeps_the_steps_a_measured_run_decodes(seed):
    """Brute force: walk each request's steps in order, keeping a step while fewer than N tokens came before
    it (a step emits num_accepted + 1); rows of a kept step are all kept, requests of two runs apart."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(seed)
    rows, want = [], set()
    for run in ("a", "b"):
        for req in range(3):
            before = 0
            for step in range(12):
                acc = int(rng.integers(0, 4))
                for pos in range(3):  # three slot rows per step, each repeating the step's num_accepted
                    rows.append({"run_id": run, "request_id": f"r{req}", "step": step, "position": pos,
                                 "num_accepted": acc})
                if before < 10:
                    want.add((run, f"r{req}", step))
                before += acc + 1
    df = pl.DataFrame(rows).sample(fraction=1.0, shuffle=True, seed=seed)  # order must not matter
    got = sim_vs_measured.first_tokens(df, 10)
    assert {(r["run_id"], r["request_id"], r["step"]) for r in got.iter_rows(named=True)} == want
    assert got.height == 3 * len(want)


def test_measured_prompts_are_the_first_c_of_each_dataset():
    from avkit.workloads import load_workload

    ids = sim_vs_measured.measured_prompts(["humaneval"], 4)
    assert ids == [f"humaneval/{p.prompt_id}" for p in load_workload("humaneval", 4, seed=0)]
    assert sim_vs_measured.measured_prompts(["humaneval"], 16)[:4] == ids  # c = 4's prompts lead c = 16's
