"""`bench/adaptive.py live` run as a user runs it (a subprocess; tests import no bench script): the live
benchmark protocol runs end to end on tiny random models (`--tiny`), its paired ratio of adaptive / best fixed
K is a Student t interval over the repeats' log ratios (scipy as the oracle), `--resume` keeps what it holds,
and `--predict` gives each cell what `avkit simulate` gives for its kept trace; `adaptive.py mixed` composes
`avkit simulate`'s rates at c1, c4, c16 into the equal-time mix."""

import json
from itertools import pairwise
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

from avkit.scheduling.cost import CostTable
from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]


def _live(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/adaptive.py", "live", "--tiny", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


def test_tiny_protocol_runs_through_the_cli(tmp_path, capsys):
    out, kept = tmp_path / "al.md", tmp_path / "traces"
    p = _live("--out", str(out), "--traces", str(kept))
    assert p.returncode == 0, p.stderr[-3000:]
    c1, c2, mix = json.loads(out.with_suffix(".json").read_text())  # c = 1, c = 2, their equal-time mix
    assert (c1["concurrency"], c2["concurrency"], mix["concurrency"]) == (1, 2, "mixed")
    A = "adaptive-stop:online_logistic"
    for cell in (c1, c2):
        assert set(cell["runs"]) == {"fixed:0", "fixed:2", A} and cell["finalists"] in (["fixed:0", "fixed:2"],
                                                                                       ["fixed:2", "fixed:0"])
        order = sorted((r["seq"], p, r) for p, rs in cell["runs"].items() for r in rs)  # the cell's runs in turn
        assert [s for s, _, _ in order] == list(range(3 + 1 + 2 * 2 * 3))  # screen, then A and 3 rounds of (f1, A, f2, A)
        assert [p for _, p, r in order if r["repeat"] == 0] == ["fixed:0", "fixed:2", A]  # the screen: each once
        tail = [p for _, p, r in order if r["repeat"] > 0]
        assert tail[0::2] == [A] * 7 and tail[1::2] == cell["finalists"] * 3  # A f1 A f2 ... A
        for metric in ("decode_tok_s", "tok_s"):
            r = cell[metric]
            pairs = {}  # finalist -> [(its rate, sqrt(rate before * rate after))], by a loop over the order
            for i, (_, p, run) in enumerate(order):
                if p != A and run["repeat"] > 0:
                    pairs.setdefault(p, []).append((run[metric], (order[i - 1][2][metric] *
                                                                  order[i + 1][2][metric]) ** 0.5))
            best = max(pairs, key=lambda f: np.mean([f_ for f_, _ in pairs[f]]))
            b, a = np.array(pairs[best]).T
            ci = stats.ttest_1samp(np.log(a / b), 0.0).confidence_interval(0.95)
            assert r["best_fixed"] == best and 0 < r["lo"] <= r["ratio"] <= r["hi"]
            assert r["ratio"] == pytest.approx(np.exp(np.log(a / b).mean()))
            assert (r["lo"], r["hi"]) == pytest.approx((np.exp(ci.low), np.exp(ci.high)))
    for metric in ("decode_tok_s", "tok_s"):  # each round's mix: the mean of that round's pairs in the two cells
        r = mix[metric]
        f = r["best_fixed"]
        rates = [[x[metric] for x in sorted(c["runs"][f], key=lambda x: x["seq"]) if x["repeat"] > 0] for c in (c1, c2)]
        assert r["mean"][f] == pytest.approx((c1[metric]["mean"][f] + c2[metric]["mean"][f]) / 2)
        assert len(rates[0]) == len(rates[1]) == 3 and 0 < r["lo"] <= r["ratio"] <= r["hi"]
    assert "adaptive-stop:online_logistic / best fixed K" in out.read_text()
    assert c1["date"] and c1["commit"] and "load" in c1  # each cell names when and on what it ran
    for cell in (c1, c2):  # steady tok/s of the kept run (fixed:2, repeat 1), by a loop over its engine steps
        gens = pl.read_parquet(kept / f"tiny_T1_c{cell['concurrency']}.generations.parquet")
        times = gens["token_s"].to_list()
        ends = sorted({t for ts in times for t in ts})
        tokens = seconds = steps = 0.0
        for prev, end in pairwise(ends):
            lanes = [ts for ts in times if ts[0] < end <= ts[-1]]  # decoding into this step
            if len(lanes) == cell["concurrency"] and not any(ts[0] == end for ts in times):
                tokens += sum(ts.count(end) for ts in times)
                seconds += end - prev
                steps += 1
        run = cell["runs"]["fixed:2"][0]  # the screen's
        assert run["steady_tokens"] == tokens > 0 and run["decode_tok_s"] == pytest.approx(tokens / seconds)
        assert run["steady_steps"] == steps
        logged = [json.loads(line) for line in
                  (kept / f"tiny_T1_c{cell['concurrency']}.steps.jsonl").read_text().splitlines()]  # every run's steps
        assert {(s["policy"], s["repeat"]) for s in logged} >= {("fixed:2", r) for r in range(4)}
        assert all(s["passes"] <= 2 and s["num_requests"] <= cell["concurrency"] and s["ms"] > 0 for s in logged)
        assert not any(s["policy"] == "fixed:0" for s in logged)  # a target-only run drafts nothing: no rows

    # --resume measures nothing it holds; --predict replays each kept trace, as `avkit simulate` does
    p = _live("--out", str(out), "--traces", str(kept), "--resume")
    assert p.returncode == 0 and json.loads(out.with_suffix(".json").read_text()) == [c1, c2, mix], p.stderr[-3000:]
    cost = tmp_path / "cost.json"
    CostTable((1, 8, 32), (1.0, 1.6, 4.0), (1, 8), (0.1, 0.3)).save(cost)
    p = _live("--out", str(out), "--traces", str(kept), "--predict", str(cost))
    assert p.returncode == 0, p.stderr[-3000:]
    for cell in json.loads(out.with_suffix(".json").read_text())[:2]:
        trace = kept / f"tiny_T1_c{cell['concurrency']}.parquet"
        sim = tmp_path / f"sim{cell['concurrency']}.parquet"
        code, _, err = run_cli(capsys, "simulate", trace, "--cost", cost, "--concurrency", cell["concurrency"],
                               "--policy", ",".join(cell["runs"]), "--out", sim)  # in process: no second start-up
        assert code == 0, err[-3000:]
        for key, col in (("tok_s", "throughput_tok_s"), ("tokens_per_step", "tokens_per_step"), ("step_ms", "step_ms")):
            assert list(cell["predicted"][key].values()) == pytest.approx(pl.read_parquet(sim)[col].to_list(), rel=1e-9)
    assert "predicted / measured" in out.read_text()  # the split of each policy's error
    assert "## The simulator against these cells" in out.read_text()
    # --predict cell: each cell under the cost model its adaptive runs carried (as serve snapshots it)
    p = _live("--out", str(out), "--traces", str(kept), "--predict", "cell")
    assert p.returncode == 0, p.stderr[-3000:]
    for cell in json.loads(out.with_suffix(".json").read_text())[:2]:
        learned = kept / f"tiny_T1_c{cell['concurrency']}.learned_cost.json"
        assert cell["predicted"]["cost"] == str(learned) and CostTable.load(learned).meta["source"] == "learned"
        assert CostTable.load(learned).meta["prior"] == "learned"  # carried: the last run started from a learned model
    # --predict replay:COST: today's learner over each cell's kept steps, runs carried from COST (cost_cell.py)
    p = _live("--out", str(out), "--traces", str(kept), "--predict", f"replay:{cost}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert all("through today's learner" in c["predicted"]["cost"]
               for c in json.loads(out.with_suffix(".json").read_text())[:2])

    # bad input: one line naming what; a run with other policies keeps the cells it does not measure
    p = _live("--out", str(out), "--traces", str(kept), "--predict", str(tmp_path / "none.json"))
    assert p.returncode != 0 and p.stderr.strip().splitlines() == [
        f"adaptive.py live: error: --predict: no cost file {str(tmp_path / 'none.json')!r}"]
    bad = tmp_path / "bad.md"
    bad.with_suffix(".json").write_text("{")
    p = _live("--out", str(bad))
    assert p.returncode != 0 and p.stderr.strip().startswith(f"adaptive.py live: error: {bad.with_suffix('.json')}: ")
    held = json.loads(out.with_suffix(".json").read_text())[:2]
    p = _live("--out", str(out), "--traces", "", "--ks", "0,1", "--concurrency", "1", "--repeats", "2",
              "--finalists", "1", "--keep", "0")
    assert p.returncode == 0, p.stderr[-3000:]
    store = json.loads(out.with_suffix(".json").read_text())
    assert [c for c in store if set(c["runs"]) == set(held[0]["runs"])] == held
    new, = [c for c in store if set(c["runs"]) == {"fixed:0", "fixed:1", "adaptive-stop:online_logistic"}]
    screen = {p: rs[0]["decode_tok_s"] for p, rs in new["runs"].items() if p != A}
    best = max(screen, key=screen.get)  # --finalists 1 --keep 0: the screen's best, and fixed:0 whatever it did
    assert new["finalists"] == [best] + (["fixed:0"] if best != "fixed:0" else [])
    p = _live("--out", str(out), "--keep", "5")
    assert p.returncode != 0 and p.stderr.strip().splitlines()[-1].endswith("--keep: 5 not in --ks")


def test_mixed_prediction_composes_what_avkit_simulate_gives(tmp_path, capsys):
    """`adaptive.py mixed`: each policy's rate per concurrency is `avkit simulate`'s for the same trace, cost model
    and warm start; the mix is their mean (equal time) and its ratio is over the best single fixed K."""
    out, cost = tmp_path / "mixed.md", "bench/results/cost_learned_T0.json"
    p = subprocess.run([sys.executable, "bench/adaptive.py", "mixed", "--datasets", "humaneval", "--costs",
                        "bench/results/cost_learned_T{T}.json", "--out", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    label = "humaneval (kept live c1 run humaneval_T0_c1)"
    rows = [line.split(" | ") for line in out.read_text().splitlines() if line.startswith(f"| {label} | 0 | ")]
    table = {r[2]: [float(v) for v in r[3:6]] for r in rows if len(r) == 8}  # policy -> c1, c4, c16 tok/s
    mix = {r[2]: float(r[6]) for r in rows if len(r) == 8}
    assert len(table) == 8  # the live grid's 7 policies and adaptive-stop without its gate
    sim = tmp_path / "sim.parquet"
    code, _, err = run_cli(capsys, "simulate", ROOT / "bench/results/adaptive_live_traces/humaneval_T0_c1.parquet",
                           "--cost", ROOT / cost, "--concurrency", "1,4,16", "--policy", ",".join(table),
                           "--coefficients", ROOT / "traces/coefficients.json", "--out", sim)
    assert code == 0, err[-3000:]
    df = pl.read_parquet(sim)
    for c, i in ((1, 0), (4, 1), (16, 2)):
        rates = df.filter(pl.col("concurrency") == c)["throughput_tok_s"].to_list()  # in --policy order
        assert [v[i] for v in table.values()] == pytest.approx(rates, abs=0.006)  # 2 decimals in the Markdown
    for p_, v in table.items():
        assert mix[p_] == pytest.approx(np.mean(v), abs=0.01)
    best = max(v for p_, v in mix.items() if p_.startswith("fixed:"))
    summary = next(line.split(" | ") for line in out.read_text().splitlines() if line.startswith(f"| {label} | 0 | 2 |"))
    assert float(summary[6].strip("*")) == pytest.approx(mix["adaptive-stop:online_logistic"] / best, abs=2e-3)
    # the live protocol's finalists per c: the two fixed K of the best rates; the mix needs one finalist at every c
    screen = next(r for r in rows if len(r) == 6)
    top = [sorted((p_ for p_ in table if p_.startswith("fixed:")), key=lambda p_: -table[p_][i])[:2] for i in range(3)]
    assert [s_.split(", ") for s_ in screen[2:5]] == top
    assert screen[5].strip(" |") == (", ".join(f for f in top[0] if f in top[1] and f in top[2]) or "none")
