"""Adaptive verification benchmark (bench/README.md: usage and the live protocol).

1. Trace replay (avkit.sim) at concurrency 1..256 under H200 roofline costs for an 8B target, with the recorded
   draft model and with a parallel drafter: no-spec, every fixed K, the adaptive variants and the oracle ->
   bench/results/adaptive.md (+ one Parquet per cost model).
2. Overhead: the live policy's `draft_this_step` + `num_verify` + `observe` at batch 256, K = 7 on this CPU.
3. `live`: adaptive verification against the best fixed K through `avkit record --policy`, paired 95% intervals
   -> adaptive_live.{md,json} (bench/adaptive_live.py).
4. `mixed`: the simulator's prediction of the live mixed load (equal time at c1, c4, c16, composed as `live`
   composes it) on this CPU's learned cost models, and what measuring it live would take -> adaptive_mixed_sim.md.
"""

from __future__ import annotations

import argparse
import glob
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import torch

from avkit.config import (DEFAULT_COST_PATH, EngineConfig, ProfileConfig, SamplingConfig, SimulateConfig,
                          SyntheticConfig)
from avkit.kernels.dispatch import select_kernels
from avkit.markdown import md_table
from avkit.models import load
from avkit.models.testing import write_tiny_model
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.runtime.trace_rows import MemorySink
from avkit.scheduling.adaptive import make_adaptive
from avkit.scheduling.cost import CostTable, resolve_cost
from avkit.scheduling.profile import profile_costs
from avkit.step_types import DraftBatch, Load, VerifyOutcome
from avkit.throughput_text import tok
from avkit.sim.steps import StepTable
from avkit.sim.replay import default_policies, load_steps, simulate, simulate_and_write, step_time_check
from avkit.trace.reader import read_traces
from avkit.trace.synthetic import synthetic_trace
from adaptive_live import live_main
from common import header, write  # bench/ is on sys.path when run as a script

SUMMARIZED = ("adaptive-online_logistic", "adaptive-stop-online_logistic", "adaptive-stop-nogate-online_logistic",
              "adaptive-oracle")
ROOFLINE_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the H200 tables: where adaptive must gain
COSTS = {
    "h200_8b_ar": ("roofline:H200:8b", "H200, 8B target, Qwen2.5-Coder-0.5B draft model (autoregressive)"),
    "h200_8b_parallel": ("roofline:H200:8b:1b:drafter=parallel", "H200, 8B target, parallel drafter (1B, one pass)"),
}
# This CPU's profiled table, written for `adaptive.py live`: the simulator's view of the live benchmark.
LIVE_COST = Path("bench/results/adaptive_live_cost.json")
LIVE_CONCURRENCY = (1, 4, 16)


def load_trace_steps(paths: list[str]):
    if not paths:
        paths = sorted(p for p in glob.glob("traces/*.parquet") if not p.endswith(".generations.parquet"))
    if paths:
        return load_steps(paths), f"{len(paths)} recorded trace file(s): {', '.join(paths)}", paths
    # Shaped like the Qwen2.5-Coder pair's recordings (per-slot acceptance ~0.8-0.9, ~5 tokens/step).
    cfg = SyntheticConfig(num_slots=400_000, k=7, trim_prob=0.0, batch_size=8, steps_per_request=48,
                          intercepts=(2.0, 1.8, 1.6, 1.5, 1.4, 1.3, 1.2), feature_means=(3.0, 1.5), seed=1)
    return load_steps(pl.from_arrow(synthetic_trace(cfg))), "SYNTHETIC trace (no traces/*.parquet yet)", []


def markdown_table(df: pl.DataFrame) -> str:
    """Policies x concurrency: tokens/s (x best fixed K); bold: the best at that concurrency."""
    conc = sorted(set(df["concurrency"].to_list()))
    best = {c: df.filter(pl.col("concurrency") == c)["throughput_tok_s"].max() for c in conc}
    rows = []
    for policy in dict.fromkeys(df["policy"].to_list()):
        rows.append([policy])
        for c in conc:
            r = df.filter((pl.col("policy") == policy) & (pl.col("concurrency") == c)).row(0, named=True)
            cell = f"{tok(r['throughput_tok_s'])} ({r['vs_best_fixed']:.2f})"
            rows[-1].append(f"**{cell}**" if r["throughput_tok_s"] >= best[c] else cell)
    return md_table(["policy", *(f"c={c}" for c in conc)], rows)


def shape_summary(df: pl.DataFrame, policy: str) -> str:
    rows = df.filter(pl.col("policy") == policy).sort("concurrency")
    parts = [f"c{c}: {v:+.1%}" for c, v in zip(rows["concurrency"], rows["vs_best_fixed"] - 1.0)]
    return f"{policy} vs best fixed K: " + ", ".join(parts)


def policy_overhead(batch: int = 256, k: int = 7, repeats: int = 200) -> dict:
    """Median wall time of the gate, num_verify and observe for one step of `batch` requests."""
    g = torch.Generator().manual_seed(0)
    feats = {"logit_qmax": torch.randn(batch, k, generator=g) * 2 + 2}
    drafted = torch.full((batch,), k, dtype=torch.int64)
    policy = make_adaptive(cost="roofline:H200:8b", estimator="online_logistic", k=k, stop_drafting=True)
    policy.use_kernels(select_kernels("cpu"))  # as the engine does: the torch kernels on a CPU
    load = Load(batch, batch, batch)
    accepted = torch.randint(0, k + 1, (batch,), generator=g)
    decide, learn, gate = [], [], []
    for _ in range(repeats):
        tg = time.perf_counter()
        policy.draft_this_step(load)  # the gate: its window is full after the first step (64 rows)
        t0 = time.perf_counter()
        gate.append(t0 - tg)
        plan = policy.num_verify(DraftBatch(feats, drafted), load)
        t1 = time.perf_counter()
        nv = plan.num_verify
        policy.observe(VerifyOutcome(feats, plan.confidences, nv, torch.minimum(accepted, nv)))
        t2 = time.perf_counter()
        decide.append(t1 - t0)
        learn.append(t2 - t1)
    cost = resolve_cost("roofline:H200:8b")
    step_ms = float(cost.step_cost(batch, k, batch + int(nv.sum())))
    total_ms = 1e3 * (statistics.median(gate) + statistics.median(decide) + statistics.median(learn))
    return {"gate_us": 1e6 * statistics.median(gate[1:]),
            "num_verify_us": 1e6 * statistics.median(decide), "observe_us": 1e6 * statistics.median(learn),
            "total_ms": total_ms, "h200_step_ms": step_ms, "share_h200": total_ms / step_ms,
            "verified": int(nv.sum()), "threads": torch.get_num_threads()}


def step_time_section(workdir: Path) -> str:
    """Record a small trace with a tiny random pair on this CPU, profile the same pair, compare step times."""
    target = load(write_tiny_model(workdir / "t", vocab=2000, seed=0, hidden=256, layers=4, heads=8, kv_heads=2,
                                   intermediate=768, init_std=0.3))
    draft = load(write_tiny_model(workdir / "d", vocab=2000, seed=1, hidden=128, layers=2, heads=4, kv_heads=2,
                                  intermediate=384, init_std=0.3))
    sink = MemorySink()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the shared 2-core box thrashes with more
    engine = Engine(target, draft, EngineConfig(k=5, concurrency=8, max_len=160), sink=sink)
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=32, seed=0)
    g = torch.Generator().manual_seed(0)
    reqs = [Request(f"r{i}", torch.randint(10, 1900, (32,), generator=g).tolist(), sampling) for i in range(16)]
    engine.generate(reqs)
    cols = sink.columns()
    rows = len(next(iter(cols.values())))
    table = {k: pa.array(np.ma.getdata(v), mask=np.ma.getmaskarray(v)) if isinstance(v, np.ma.MaskedArray)
             else pa.array(v) for k, v in cols.items()}
    frame = pl.from_arrow(pa.table({**table, "run_id": pa.array(["tiny"] * rows)}))
    cost = profile_costs(target, draft, ProfileConfig(context_len=48, k=5, max_verify_tokens=48, max_requests=8, repeats=7))
    torch.set_num_threads(threads)
    check = step_time_check(frame, cost)
    return ("## Predicted vs recorded step time (this CPU, tiny random pair: 4x256 target, 2x128 draft)\n\n"
            f"{check['engine_steps']} engine steps recorded at batch <= 8, K = 5, 1 torch thread on the shared "
            f"2-core box; cost table profiled on the same pair at context 48. Predicted/recorded median {check['median_ratio']:.3f}, median |error| "
            f"{100 * check['median_abs_rel_error']:.1f}% (recorded mean {check['mean_recorded_ms']:.2f} ms, "
            f"predicted {check['mean_predicted_ms']:.2f} ms). The profile times each forward with the engine's logits "
            "work (sampling distributions, draft features and draw); what it cannot see: rejection sampling, KV "
            "rollback, trace rows, the drafter's catch-up token, prefill of admitted prompts, and other jobs on "
            "this shared box. Real-pair check: `avkit profile --dtype bfloat16` then "
            "`avkit simulate traces/*.parquet --cost ~/.cache/avkit/cost.json --step-time`.\n")


def real_step_time_lines(steps) -> str:
    """Recorded step times of the real traces vs a CPU roofline and (if profiled) this CPU's cost table."""
    specs = ["roofline:cpu:1.5b:0.5b:context=512"]
    if Path(DEFAULT_COST_PATH).expanduser().is_file():
        specs.append(DEFAULT_COST_PATH)
    lines = ["\nReal traces (the real pair on this CPU):\n"]
    for spec in specs:
        check = step_time_check(steps, resolve_cost(spec))
        for label, c in (("all steps", check), ("decode-only steps", check["decode_only"])):
            lines.append(f"- `{spec}`, {label}: predicted/recorded median {c['median_ratio']:.3f}, median |error| "
                         f"{100 * c['median_abs_rel_error']:.0f}% over {c['engine_steps']} engine steps (recorded "
                         f"mean {c['mean_recorded_ms']:.0f} ms, predicted {c['mean_predicted_ms']:.0f} ms)")
    lines.append("  Decode-only steps exclude steps that admitted a request: their wall time holds the prompt's "
                 "prefill (target and drafter), which a decode cost table does not price. The CPU roofline assumes "
                 "fp32-sized weights at 12 GB/s and 0.1 TFLOP/s; the profiled table (`avkit profile --dtype "
                 "bfloat16 --context-len 512`, idle box, 2 threads) times forwards plus logits work at one "
                 "context, while the traces mix 1- and 2-thread runs (traces/README.md) and contexts up to ~830 "
                 "tokens.\n")
    return "\n".join(lines)


MIXED_POLICIES = [f"fixed:{k}" for k in (0, 1, 2, 3, 5, 7)] + ["adaptive-stop:online_logistic"]  # the live grid's
SHIPPED = {0.0: "traces/greedy_k7.parquet", 1.0: "traces/sampled_t1.0_k7.parquet"}  # every slot labelled (policy full)
KEPT = "bench/results/adaptive_live_traces/humaneval_T{T}_c1.parquet"  # a live cell's kept fixed:7 run
NOGATE = "adaptive-stop-nogate:online_logistic"  # not in the live grid: what the draft gate decides, by its absence
MIXED_NOTE = (
    "`avkit.sim.replay.simulate` of each trace at c = 1, 4, 16, the live grid's policies (adaptive warm-started from "
    "`traces/coefficients.json`, as live). The mix spends equal time at each c: its tok/s is the mean of the three "
    "steady rates (as `adaptive.py live` composes its cells); best fixed K: one K for the whole mix. Per c: adaptive / "
    "the best fixed K there (which K). Per-c best K / best: each c's best fixed K, mixed, over the best single K (what "
    "picking K per concurrency alone gains; picking per step may gain more). Goal: mix >= 1.05. Beside the grid, "
    f"`{NOGATE}` (every policy table): the same policy without its draft gate.\n\n"
    "Cost models: `cost_learned_T{T}.json`, the online model `bench/live.py cost` learned over batch 1, 4, 16 x K 0, 3, "
    "5, 7 on this CPU (24 of 24 cells within 10% of live steps, `cost_live.md`), the one table whose batch 4 and 16 "
    "prices come from timed steps (the c1 cells' tables saw batch 1 alone and carry its batch 4/16 prices unchanged); "
    "`cost_live_T{T}.json`, that grid's fresh profile (6 of 24 within 10%), as a sensitivity check.\n")


def mixed_cases(datasets: list[str]) -> list[tuple[str, float, StepTable]]:
    """(label, T, steps): the shipped traces' requests of each dataset per temperature, then each kept live trace."""
    out = []
    for t, path in SHIPPED.items():
        rows = read_traces([path])
        out += [(f"{d} (shipped {Path(path).stem})", t, load_steps(rows.filter(pl.col("dataset") == d)))
                for d in datasets]
        if Path(kept := KEPT.format(T=f"{t:g}")).is_file():
            out.append((f"humaneval (kept live c1 run {Path(kept).stem})", t, load_steps([kept])))
    return out


def mix_rates(steps: StepTable, cost: str, concurrency: tuple[int, ...]) -> dict:
    """policy -> {c: simulated steady tok/s, 'mixed': their mean (equal time at each c), 'drafted': {c: drafts per
    request-step}}."""
    policies = MIXED_POLICIES + [NOGATE]
    df = simulate(steps, CostTable.load(cost), list(concurrency), policies, coefficients="traces/coefficients.json")
    out = {p: {"drafted": {}} for p in policies}
    for c in concurrency:  # one row per policy, in their order
        for p, r in zip(policies, df.filter(pl.col("concurrency") == c).iter_rows(named=True)):
            out[p][c], out[p]["drafted"][c] = r["throughput_tok_s"], r["drafted_per_step"]
    for p in out:
        out[p]["mixed"] = float(np.mean([out[p][c] for c in concurrency]))
    return out


def best_fixed(rates: dict, at, n: int = 1):
    """The fixed K of the highest rate at `at` (a c or 'mixed'); n > 1: the n best, best first."""
    ranked = sorted((p for p in rates if p.startswith("fixed:")), key=lambda p: -rates[p][at])
    return ranked[0] if n == 1 else ranked[:n]


def live_minutes(r: dict, c: int, finalists: list[str], repeats: int, new_tokens: float) -> float:
    """Minutes of decoding of one live cell (`adaptive.py live`'s protocol): an adaptive warm-up run, the screen (every
    policy once), an adaptive run, then `repeats` rounds of each finalist followed by an adaptive run; every run 2 c
    requests of `new_tokens` at the simulated steady rates `r`."""
    runs = {p: 1 for p in MIXED_POLICIES} | {MIXED_POLICIES[-1]: 3 + repeats * len(finalists)}
    runs |= {f: 1 + repeats for f in finalists}
    return sum(n * 2 * c * new_tokens / r[p][c] for p, n in runs.items()) / 60


def mixed_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="adaptive.py mixed", description="the simulated mixed load (bench/README.md)")
    ap.add_argument("--costs", default="bench/results/cost_learned_T{T}.json,bench/results/cost_live_T{T}.json",
                    help="cost models, comma-separated ({T}: per temperature); the first is the prediction")
    ap.add_argument("--datasets", default="humaneval,sharegpt")
    ap.add_argument("--new-tokens", type=float, default=224.0, help="new tokens per request of a live run (the live "
                    "cost estimate; the HumanEval c1 cells averaged 224 at T = 0, 185 at T = 1)")
    ap.add_argument("--finalists", type=int, default=2, help="as `adaptive.py live`: fixed K kept after its screen")
    ap.add_argument("--repeats", type=int, default=4, help="as `adaptive.py live`: rounds after the screen")
    ap.add_argument("--out", default="bench/results/adaptive_mixed_sim.md")
    args = ap.parse_args(argv)
    conc, adaptive, costs = LIVE_CONCURRENCY, MIXED_POLICIES[-1], args.costs.split(",")
    rows, detail, minutes, screens = [], [], [], []
    for label, t, steps in mixed_cases(args.datasets.split(",")):
        for i, cost in enumerate(spec.replace("{T}", f"{t:g}") for spec in costs):
            r = mix_rates(steps, cost, conc)
            b, best = best_fixed(r, "mixed"), {c: best_fixed(r, c) for c in conc}
            ceiling = np.mean([r[best[c]][c] for c in conc]) / r[b]["mixed"]
            rows.append([label, f"{t:g}", f"{steps.num_requests}", f"`{cost}`", f"{b} {r[b]['mixed']:.2f}",
                         f"{r[adaptive]['mixed']:.2f}", f"**{r[adaptive]['mixed'] / r[b]['mixed']:.3f}**",
                         f"{ceiling:.3f}", *(f"{r[adaptive][c] / r[best[c]][c]:.3f} ({best[c]})" for c in conc),
                         " / ".join(f"{r[adaptive]['drafted'][c]:.2f}" for c in conc)])
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
            if i == 0:
                top = {c: best_fixed(r, c, args.finalists) for c in conc}
                common = [f for f in top[1] if all(f in top[c] for c in conc)]
                screens.append([label, f"{t:g}", *(", ".join(top[c]) for c in conc), ", ".join(common) or "none"])
                detail += [[label, f"{t:g}", p, *(f"{r[p][c]:.2f}" for c in conc), f"{r[p]['mixed']:.2f}",
                            f"{r[p]['mixed'] / r[b]['mixed']:.3f}"] for p in r]
            if i == 0 and label.startswith("humaneval (shipped"):
                minutes.append([f"{t:g}", *(f"{live_minutes(r, c, top[c], args.repeats, args.new_tokens):.0f}"
                                            for c in conc)])
    text = [header("Simulated mixed load: adaptive-stop / best fixed K at equal time in c1, c4, c16"), MIXED_NOTE,
            md_table(["trace", "T", "requests", "cost model", "mix: best fixed K (tok/s)", "mix: adaptive",
                      "mix: adaptive / best", "mix: per-c best K / best", *(f"c{c}: adaptive / best (K)" for c in conc),
                      "adaptive drafts / request-step (c1 / c4 / c16)"], rows),
            f"\n## Every policy under `{costs[0]}`\n",
            md_table(["trace", "T", "policy", *(f"c{c} tok/s" for c in conc), "mix tok/s", "mix / best fixed"], detail),
            "\n## The live protocol's finalists, as simulated\n",
            f"`adaptive.py live` keeps the {args.finalists} fixed K of the best screen rates per cell and composes the "
            "mix against the fixed K that were finalists in every cell of it (none: no mix). The simulated rates' "
            f"top {args.finalists} per c under `{costs[0]}`:\n",
            md_table(["trace", "T", *(f"c{c} finalists" for c in conc), "finalist at every c"], screens),
            "\n## What measuring the mix live costs\n",
            f"`python bench/adaptive.py live --concurrency C`, per cell (`live_minutes`): an adaptive warm-up run, the "
            f"screen ({len(MIXED_POLICIES)} runs), an adaptive run, {args.repeats} rounds of the {args.finalists} "
            f"simulated finalists each followed by an adaptive run; each run 2 C requests of {args.new_tokens:g} new "
            f"tokens at the simulated steady rate under `{costs[0]}` (HumanEval, shipped trace). Model loads, prefill, "
            "ramp and drain are left out: lower bounds, minutes of decoding.\n",
            md_table(["T", *(f"c{c} cell (min)" for c in conc)], minutes), ""]
    write({Path(args.out): "\n".join(text)})
    print("\n".join(text))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["live"]:
        return live_main(argv[1:])  # bench/adaptive_live.py
    if argv[:1] == ["mixed"]:
        return mixed_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--out", default="bench/results/adaptive.md")
    args = ap.parse_args(argv)
    steps, source, paths = load_trace_steps(args.traces)
    config = SimulateConfig()
    specs = default_policies(steps, config) + ["adaptive-stop-nogate:online_logistic"]  # what the gate adds
    out = Path(args.out)
    title = (f"# Adaptive verification benchmark\n\nTraces: {source}; {steps.request.size} recorded steps of "
              f"{steps.num_requests} requests, K = {steps.k}. Cells: simulated throughput tokens/s "
              f"(x best fixed K at that concurrency); bold = best. Command: `python bench/adaptive.py`.\n")
    sections = [title]
    costs = {key: (spec, title, ROOFLINE_CONCURRENCY, "context 8192") for key, (spec, title) in COSTS.items()}
    if LIVE_COST.is_file():
        costs["cpu_live"] = (str(LIVE_COST), "This CPU, the real pair (profiled table of `adaptive.py live`)",
                             LIVE_CONCURRENCY, "profiled with the engine's logits work; compare "
                             "`bench/results/adaptive_live.md`, measured live with the same table")
    for key, (spec, title, concurrency, note) in costs.items():
        t0 = time.perf_counter()
        table = resolve_cost(spec)
        df, _ = simulate_and_write(paths, table, replace(config, cost=spec, concurrency=tuple(concurrency)),
                                   out.with_name(f"adaptive_sim_{key}.parquet"), steps=steps, policies=specs,
                                   command="bench/adaptive.py")
        seconds = time.perf_counter() - t0
        summary = "\n".join(f"- {shape_summary(df, p)}" for p in SUMMARIZED if p in df["policy"].to_list())
        sections.append(f"## {title}\n\nCost: `{spec}` ({note}). Simulated in {seconds:.1f} s.\n\n"
                        f"{markdown_table(df)}\n\n{summary}\n")
        print(sections[-1])
    with tempfile.TemporaryDirectory() as tmp:
        sections.append(step_time_section(Path(tmp)))
    if not source.startswith("SYNTHETIC"):
        sections[-1] += real_step_time_lines(steps)
    print(sections[-1])
    oh = policy_overhead()
    sections.append(
        "## Policy overhead (live `AdaptiveVerification`, batch 256, K = 7)\n\n"
        f"draft_this_step (the gate: its step replayed on 64 recent rows): {oh['gate_us']:.0f} us; "
        f"num_verify (estimator predict + scheduling/plan.py: survival, rank, argmax budget, allocation): "
        f"{oh['num_verify_us']:.0f} us; "
        f"observe (labels + IRLS statistics): {oh['observe_us']:.0f} us; total {oh['total_ms']:.3f} ms on this CPU "
        f"({oh['threads']} torch threads) = {oh['share_h200']:.1%} of the predicted H200 8B step at c=256 "
        f"({oh['h200_step_ms']:.1f} ms, {oh['verified']} drafts verified). No Python loop over slots.\n")
    print(sections[-1])
    write({out: "\n".join(sections)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
