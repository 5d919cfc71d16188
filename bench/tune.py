"""`avkit tune` on the shipped traces: the recommended schedules for an H200 (roofline, 8B target) and for
this CPU (its profiled table), with and without a TPOT SLO -> bench/results/tune.md (+ one JSON per run).

    python bench/tune.py                          # every run below
    python bench/tune.py --runs cpu --out /tmp/tune.md

Each run is the library call behind `avkit tune` with the options shown in its heading; the Markdown
repeats the command line that reproduces it.
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
from avkit.serve.snapshot import write_json_atomic
from avkit.tune import tune

RAM_GB = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9  # the profiled table's device: this box
RUNS = {
    "h200": ("H200 roofline, 8B target, Qwen2.5-Coder-0.5B drafter (autoregressive), 8192-token context",
             {"cost": "roofline:H200:8b", "context": 8192}),
    "h200_slo": ("The same with a p90 TPOT SLO of 5 ms",
                 {"cost": "roofline:H200:8b", "context": 8192, "tpot_slo_ms": 5.0}),
    "cpu": ("This CPU, the real pair's profiled table (bench/results/adaptive_live_cost.json, 512-token context)",
            {"cost": "bench/results/adaptive_live_cost.json", "concurrency": (1, 2, 4, 8, 16),
             "memory_gb": round(RAM_GB, 1)}),
}


def command(opts: dict) -> str:
    flags = []
    for key, value in opts.items():
        text = ",".join(map(str, value)) if isinstance(value, tuple) else value
        flags.append(f"--{key.replace('_', '-')} {text}")
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


def section(name: str, title: str, opts: dict, result: dict, seconds: float) -> str:
    tpot = {(r["arm"], r["concurrency"]): r["p90_tpot_ms"] for r in result["cells"]}
    out = [f"## {title}", "",
           f"`{command(opts)}` ({seconds:.0f} s on this 2-core machine, shared). Cells: predicted tokens/s "
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
    traces = sorted(p for p in glob.glob("traces/*.parquet") if not p.endswith(".generations.parquet"))
    parts = ["# `avkit tune` on the shipped traces", "",
             f"Traces: {', '.join(traces)} (Qwen2.5-Coder 1.5B target / 0.5B draft, K = 7). Command: "
             "`python bench/tune.py`. The H200 runs are what-if: the acceptance of the small pair, the step costs "
             "of an 8B target on the roofline model. Item 5 of issue 19 (the schedule applied to avkit's engine "
             "and to vLLM-CPU under a mixed load) is not measured here.", ""]
    for name in args.runs.split(","):
        title, opts = RUNS[name]
        t0 = time.perf_counter()
        result = tune(traces, TuneConfig(**opts, out=f"bench/results/tune_{name}.json"))
        seconds = time.perf_counter() - t0
        write_json_atomic(Path(f"bench/results/tune_{name}.json"), result)
        parts.append(section(name, title, opts, result, seconds))
        print(f"{name}: {seconds:.0f} s", flush=True)
    tmp = Path(args.out).with_suffix(".md.tmp")
    tmp.write_text("\n".join(parts))
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
