"""The simulator against the engines it models: fixed K x concurrency, predicted vs measured steady decode tok/s
(bench/README.md: usage, what is measured and how) -> bench/results/sim_vs_measured.{json,md}. `--synthetic
PROFILE`: vLLM's synthetic rejection sampling at a profile's rates beside the simulator (needs vLLM's Triton
path, a GPU).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import polars as pl

from avkit.config import DEFAULT_DRAFT, DEFAULT_TARGET
from avkit.engines.vllm.driver import hf_dir
from avkit.markdown import md_table
from avkit.models.tokenizer import Tokenizer
from avkit.runtime.step_log import steady_tok_s
from avkit.scheduling.cost import CostTable, resolve_cost
from avkit.sim.replay import simulate
from avkit.sim.steps import profile_steps, step_table
from avkit.trace.reader import common_k, read_traces
from avkit.tune.acceptance import wilson
from avkit.tune.arms import Arm, simulate_arms
from avkit.workloads import load_workload
from common import RESULTS, options, tiny_pair, vllm_peer, write  # bench/ is on sys.path when run as a script
from live import avkit_phase, plan, vllm_phase
from live import cells as peer_cells


def measured_prompts(datasets: list[str], c: int) -> list[str]:
    """Trace request ids of the prompts a measured cell decodes: the first c of each dataset (live.plan)."""
    return [f"{d}/{p.prompt_id}" for d in datasets for p in load_workload(d, c, seed=0)]


def first_tokens(rows, max_new_tokens: int):
    """The rows of each request's steps that start before its `max_new_tokens`-th generated token: the part of
    the recorded generation a measured run of that length decodes (a step emits num_accepted + 1 tokens)."""
    if max_new_tokens <= 0:  # no cut given: every step
        return rows
    req = ["run_id", "request_id"]
    steps = (rows.group_by([*req, "step"]).agg(pl.col("num_accepted").first()).sort([*req, "step"])
             .with_columns(((pl.col("num_accepted") + 1).cum_sum().over(req) - pl.col("num_accepted") - 1)
                           .alias("_before")))  # tokens generated before the step
    keep = steps.filter(pl.col("_before") < max_new_tokens).select(*req, "step")
    return rows.join(keep, on=[*req, "step"], how="semi")


def predicted(trace: str, cost: str, datasets: list[str], ks: list[int], concurrency: list[int],
              adaptive: str = "", coefficients: str = "", rows_of: str = "measured", max_new_tokens: int = 0) -> dict:
    """(c, K) -> simulated tok/s; K = "adaptive" for the `adaptive` spec. rows_of "measured": at each c the
    trace's rows of the prompts that cell decodes, cut at `max_new_tokens` (the default: a one-request cell
    is one prompt, whose acceptance can be far from its dataset's); "all": every row of `datasets`."""
    rows = read_traces([trace])
    rows = rows.filter(pl.col("dataset").cast(pl.Utf8).is_in(datasets))
    if rows.height == 0:
        raise SystemExit(f"avkit: error: --trace {trace}: no rows of {datasets}")
    policies = ["nospec"] + [f"fixed:{k}" for k in ks if k > 0] + ([adaptive] if adaptive else [])
    k, table = common_k([trace])[0], CostTable.load(cost)
    sets = {c: rows for c in concurrency}
    if rows_of == "measured":
        for c in concurrency:
            ids = measured_prompts(datasets, c)
            sets[c] = first_tokens(rows.filter(pl.col("request_id").cast(pl.Utf8).is_in(ids)), max_new_tokens)
            found = sets[c]["request_id"].n_unique()
            if found < len(ids):
                raise SystemExit(f"avkit: error: --trace {trace}: has {found} of the {len(ids)} prompts measured at "
                                 f"c = {c}; use --rows all")
    out = {}
    for c, mine in sets.items():
        df = simulate(step_table(mine, k), table, [c], policies, coefficients=coefficients)
        for r in df.iter_rows(named=True):
            kk = 0 if r["policy"] == "nospec" else int(r["policy"].removeprefix("fixed")) \
                if r["policy"].startswith("fixed") else "adaptive"  # (the one adaptive spec, named with a dash)
            out[(c, kk)] = r["throughput_tok_s"]
    return out


def measured(args) -> list[dict]:
    """The first c prompts of each dataset decoded greedy here, by `live.py --peer vllm`'s phases -> its cells."""
    # greedy: no fix for vLLM-CPU's expand bug (it concerns sampled verification only)
    peer = SimpleNamespace(**{**vars(args), "temperatures": [0.0], "seed": 0, "vllm_compile": False,
                              "vllm_timeout": 3600, "adaptive": False, "coefficients": "", "vllm_fix_expand": False})
    runs = plan(peer, Tokenizer.from_dir(Path(args.target_dir)))
    got = vllm_phase(peer, args.ks, runs) if args.engine == "vllm" else avkit_phase(peer, args.ks, runs, None)
    return peer_cells(runs, [(got, {})] if args.engine == "vllm" else [({}, got)])


def by_cell(cells: list[dict], engine: str, datasets: list[str], ks: list, concurrency: list[int]) -> dict:
    """(c, K) -> measured steady tok/s (mean over datasets), e2e tok/s, load, from `bench/live.py --peer vllm`
    cells (greedy runs of `datasets`); K = "adaptive" takes avkit's adaptive cells. A (c, K) some dataset lacks
    (or has no steady window in) is left out."""
    got = [x for x in cells
           if x["engine"] == engine and x["dataset"] in datasets and x["T"] == 0
           and x["c"] in concurrency and x.get("steady_tok_s") is not None]
    out = {}
    for c in concurrency:
        for k in ks:
            mine = [x for x in got if x["c"] == c and (x["K"] == k or x["config"] == k)]
            if len(mine) == len(datasets):
                out[(c, k)] = {"tok_s": sum(x["steady_tok_s"] for x in mine) / len(mine),
                               "e2e": sum(x["tok_s"] for x in mine) / len(mine),
                               "load": max(x["load"] for x in mine), "max_new_tokens": mine[0]["max_new_tokens"]}
    return out


def _k_order(x: dict) -> tuple:
    """Sort key: fixed K ascending, then adaptive."""
    return (0, x["K"]) if isinstance(x["K"], int) else (1, 0)


def render(cells: list[dict]) -> str:
    lines = ["# Simulator vs measured: fixed K x concurrency", "",
             "`python bench/sim_vs_measured.py` (bench/README.md). Predicted: `avkit simulate` of the engine's own "
             "trace (rows `measured`: the prompts each cell decoded, cut at its new tokens; `all`: every row of "
             "the datasets) with the engine's own cost table (steady state); measured: the first c prompts decoded "
             "together, steady decode tok/s (all c requests past prefill, none finished); e2e: tokens / wall "
             "incl. prefill. Ratio = predicted / measured steady (goal: within 10%). "
             "Speedup = tok/s over K = 0 at the same c (predicted, measured).", ""]
    for engine in sorted({c["engine"] for c in cells}):
        mine = [c for c in cells if c["engine"] == engine]
        lines += [f"## {engine}", "", f"trace `{mine[0]['trace']}`, cost `{mine[0]['cost']}`, datasets "
                  f"{', '.join(mine[0]['datasets'])}, {mine[0]['max_new_tokens']} new tokens, {mine[0]['dtype']}, measured cells: "
                  f"{mine[0].get('source', 'measured here')}, rows {mine[0].get('rows', 'all')}", ""]
        best_lines, rows = [], []
        for c in sorted({x["c"] for x in mine}):
            row = sorted((x for x in mine if x["c"] == c), key=_k_order)
            base = next((x for x in row if x["K"] == 0), None)
            for x in row:
                sp = lambda key, x=x, base=base: f"{x[key] / base[key]:.2f}" if base else "-"
                label = x["K"] if isinstance(x["K"], int) else f"{x['K']} (`{x.get('policy', '')}`)"
                rows.append((str(c), str(label), f"{x['predicted']:.2f}", f"{x['measured']:.2f}",
                             f"{x['predicted'] / x['measured']:.2f}", sp("predicted"), sp("measured"),
                             f"{x.get('e2e', float('nan')):.2f}", f"{x['load']:.1f}", x["when"]))
            fixed = [x for x in row if isinstance(x["K"], int)]  # the best K is over fixed K (adaptive beside it)
            pick, best = max(fixed, key=lambda x: x["predicted"]), max(fixed, key=lambda x: x["measured"])
            bp, bm = pick["K"], best["K"]
            runner = sorted(x["predicted"] for x in fixed)[-2] if len(fixed) > 1 else float("nan")
            best_lines.append(f"- c = {c}: simulator's best K = {bp}, measured best K = {bm} "
                              f"({'agree' if bp == bm else 'DISAGREE'}; over K = {[x['K'] for x in fixed]}); "
                              f"the simulator's pick measured {pick['measured'] / best['measured']:.2f}x the "
                              f"measured best, its runner-up predicted {runner / pick['predicted']:.3f}x its pick")
        lines += [md_table(("c", "K", "predicted tok/s", "measured tok/s", "ratio", "speedup pred", "speedup meas",
                            "e2e tok/s", "load", "when"), rows, [True] * 9 + [False]), "", *best_lines, ""]
    return "\n".join(lines) + "\n"


def tiny_inputs(args) -> None:
    """--tiny: a tiny pair, a vLLM trace and a native trace of it, both cost tables (all under a temp dir)."""
    target, draft = tiny_pair("avkit-simcheck-")
    root = Path(target).parent
    args.target_dir, args.draft_dir, args.dtype = str(target), str(draft), "float32"
    k, cmax = max(args.ks), max(args.concurrency)
    common = ["--target", str(target), "--draft", str(draft), "-k", str(k), "--dtype", "float32"]
    rec = common + ["--temperature", "0", "--concurrency", "2", "--num-prompts", "4", "--max-new-tokens", "24",
                    "--no-progress"] + [x for d in args.datasets for x in ("--dataset", d)]
    prof = common + ["--temperature", "0", "--context-len", "64", "--max-requests", str(cmax), "--repeats", "2"]
    trace = root / f"{args.engine}.parquet"
    cost = root / f"{args.engine}_cost.json"
    engine = ["--engine", "vllm", "--vllm-python", args.vllm_python] if args.engine == "vllm" else []
    for cmd in (["record", *rec, *engine, "--out", str(trace)],
                ["profile", *prof, *engine, "--max-verify-tokens", str(cmax * (k + 1)), "--out", str(cost)]):
        subprocess.run([sys.executable, "-m", "avkit", *cmd], check=True)
    args.trace, args.cost = str(trace), str(cost)


def synthetic_predicted(cost: str, rates: list[float], c: int, new: int) -> float:
    """The simulator's steady decode tok/s of fixed K = len(rates) at concurrency c, accepted lengths laid
    out with exactly the rates' distribution (sim/steps.py)."""
    per_request = max(1, round(new / (1 + sum(rates))))  # verify steps of a request of `new` tokens
    steps = profile_steps({"positions": [{"survival": r} for r in rates]}, steps_per_request=per_request)
    cell = simulate_arms(steps, [Arm("fixed", len(rates))], resolve_cost(cost), [c], waves=4,
                         estimator="online_logistic", gate=False)[0]
    return float(cell.metrics["decode_tok_s"])


def synthetic(args) -> None:
    """vLLM's synthetic acceptance at a profile's rates (bench/README.md) -> --out JSON."""
    spec = {**json.loads(Path(args.synthetic).read_text())["vllm_synthetic"], "model": args.draft_dir}
    rates = spec["synthetic_acceptance_rates"]
    vocab = min(1000, json.loads((Path(args.target_dir) / "config.json").read_text())["vocab_size"] - 1)
    rng, cells = random.Random(0), []
    for c in args.concurrency:
        run = {"name": f"c={c}", "prompts": [[rng.randrange(10, vocab) for _ in range(16)] for _ in range(args.requests)],
               "temperature": 0.0, "top_p": 1.0, "max_new_tokens": args.max_new_tokens, "seed": 0, "ignore_eos": True}
        jobs = {"target": args.target_dir, "dtype": "float32", "llm": {"async_scheduling": False},
                "configs": [{"k": len(rates), "speculative_config": spec, "max_num_seqs": c, "runs": [run]}]}
        results, proc = vllm_peer(args.vllm_python, jobs, 3600, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, capture=True)
        if not results:  # vLLM refused (its error is the last line it printed)
            cells.append({"concurrency": c, "error": f"exit {proc.returncode}: "
                          f"{(proc.stderr.strip().splitlines() or [''])[-1]}"})
            continue
        r = results[0]
        drafts = r["counters"].get("spec_decode_num_drafts", 0.0)
        per_pos = r["counters"].get("spec_decode_num_accepted_tokens_per_pos", [])
        ci = [wilson(int(x), int(drafts)) for x in per_pos]
        cells.append({"concurrency": c, "drafts": drafts, "accepted_per_pos": per_pos, "profile": rates,
                      "survival": [x / drafts for x in per_pos] if drafts else [], "survival_ci": ci,
                      "within": [lo <= x <= hi for x, (lo, hi) in zip(rates, ci)],
                      "measured_tok_s": steady_tok_s(r["steps"], c, waves=args.requests // c),
                      **({"predicted_tok_s": synthetic_predicted(args.cost, rates, c, args.max_new_tokens)}
                         if args.cost else {})})
        print(json.dumps(cells[-1]), file=sys.stderr)
    write({Path(args.out): {"spec": spec, "target": args.target_dir, "cells": cells}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("vllm", "avkit"), help="required, except with --synthetic")
    ap.add_argument("--trace", help="the engine's own trace (greedy, K >= max --ks)")
    ap.add_argument("--cost", help="the engine's cost table (avkit profile [--engine vllm])")
    options(ap, ks="0,3,5,7", concurrency="1,4,16", datasets="humaneval", max_new_tokens=128, target_dir="", draft_dir="",
            dtype="bfloat16", vllm_python=".venv-vllm/bin/python", tiny=False, coefficients="traces/coefficients.json")
    ap.add_argument("--adaptive", default="", help="also this simulate policy (e.g. adaptive-stop:online_logistic, "
                    "what avkit's live adaptive engine runs) against --cells' adaptive cells")
    ap.add_argument("--rows", choices=("measured", "all"), default="measured",
                    help="simulate the rows of the prompts each cell measured, cut at its new tokens (default), or "
                         "every row of --datasets")
    ap.add_argument("--synthetic", default="", metavar="PROFILE",
                    help="vLLM's synthetic acceptance at this `avkit tune --out` profile's rates (bench/README.md)")
    ap.add_argument("--requests", type=int, default=16, help="--synthetic: random prompts per concurrency")
    ap.add_argument("--out", default=str(RESULTS / "vllm_synthetic.json"), help="--synthetic: the results JSON")
    ap.add_argument("--cells", default="", help="measure nothing: take the measured cells from this "
                    "`bench/live.py --peer vllm` JSON (bench/results/engine-vllm-DATE.json)")
    args = ap.parse_args()
    if args.synthetic:
        if not (args.target_dir and args.draft_dir):
            ap.error("--synthetic needs --target-dir and --draft-dir")
        return synthetic(args)
    if args.engine is None:
        ap.error("--engine is required")
    if args.tiny and not args.trace:  # (--tiny with --trace/--cost/--target-dir/--draft-dir: reuse a dry run's inputs)
        tiny_inputs(args)
    if args.tiny:  # the tiny recording skips prompts too long for its models: the dry run replays every row
        args.rows = "all"
    elif not (args.trace and args.cost):
        ap.error("--trace and --cost are required (or --tiny)")
    if not args.target_dir:
        args.target_dir, args.draft_dir = str(hf_dir(DEFAULT_TARGET, "--target-dir")), str(
            hf_dir(DEFAULT_DRAFT, "--draft-dir"))
    if args.adaptive and not args.cells:
        ap.error("--adaptive compares with measured adaptive cells: give --cells")
    if args.cells:
        try:
            cells_in = json.loads(Path(args.cells).read_text())["cells"]
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"avkit: error: --cells {args.cells}: not a bench/live.py cells JSON "
                             f"({type(e).__name__}: {e})") from None
    meas = by_cell(cells_in if args.cells else measured(args), args.engine, args.datasets,
                   args.ks + (["adaptive"] if args.adaptive else []), args.concurrency)
    new_tokens = max((m.get("max_new_tokens", args.max_new_tokens) for m in meas.values()), default=args.max_new_tokens)
    pred = predicted(args.trace, args.cost, args.datasets, args.ks, args.concurrency, args.adaptive,
                     args.coefficients, args.rows, new_tokens)
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")
    new = [{"engine": args.engine, "c": c, "K": k, "predicted": pred[(c, k)],
            "measured": m["tok_s"], "e2e": m["e2e"], "load": m["load"], "when": when, "trace": args.trace, "cost": args.cost,
            "datasets": args.datasets, "max_new_tokens": m.get("max_new_tokens", args.max_new_tokens),
            "dtype": args.dtype, "source": args.cells or "measured here", "rows": args.rows,
            **({"policy": args.adaptive} if k == "adaptive" else {})}
           for (c, k), m in meas.items() if (c, k) in pred]
    stem = "sim_vs_measured" + ("_tiny" if args.tiny else "")  # a dry run never mixes with real cells
    cache = RESULTS / f"{stem}.json"
    old = json.loads(cache.read_text()) if cache.exists() else []
    key = lambda x: (x["engine"], x["c"], *_k_order(x))
    merged = {key(x): x for x in old}
    merged.update({key(x): x for x in new})
    cells = sorted(merged.values(), key=key)
    write({cache: json.dumps(cells, indent=1), RESULTS / f"{stem}.md": render(cells)})
    print(render([x for x in cells if x["engine"] == new[0]["engine"]]) if new else "no cells measured")


if __name__ == "__main__":
    main()
