"""Which CPU linear kernel serves the real pair fastest, end to end: the engine with each kernel, side by side.

    python bench/cpu_kernels.py                         # every kernel that runs here, 2 alternating rounds
    python bench/cpu_kernels.py --kernels avx2,amx_bf16 --rounds 3 --max-new-tokens 64

A model's forwards must all use one kernel (batch invariance: avkit/models/cpu_linear.py), so the kernel is a
deployment choice (``AVKIT_CPU_KERNEL``). For each round and kernel, one process loads the bf16 pair with that
kernel and decodes the first c HumanEval prompts (greedy, chat template) target-only and with K = 5 at c = 1 and
c = 4, printing tokens/s incl. prefill, the target's and draft's forward seconds, and whether K = 5's output equals
target-only's token for token. Kernels alternate within a round (the box's speed drifts within minutes); the
table keeps every round. Appends to bench/results/cpu_kernels.md (temp file, then rename). Timings only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def child(max_new: int) -> None:
    """One kernel (from the environment): the pair, c in (1, 4), K in (0, 5); one JSON line per cell."""
    import torch

    import avkit.models
    from avkit.config import DEFAULT_DRAFT, DEFAULT_TARGET, EngineConfig, SamplingConfig
    from avkit.runtime.engine import Engine
    from avkit.runtime.request import Request
    from avkit.workloads import load_workload

    target = avkit.models.load(DEFAULT_TARGET, dtype=torch.bfloat16)
    draft = avkit.models.load(DEFAULT_DRAFT, dtype=torch.bfloat16)
    prompts = [target.tokenizer.apply_chat_template(list(p.messages)) for p in load_workload("humaneval", n=4, seed=0)]
    for c in (1, 4):
        outs = {}
        for k in (0, 5):
            engine = Engine(target, draft if k else None,
                            EngineConfig(k=k, max_batch=c, max_len=max(map(len, prompts)) + max_new + 8, seed=0))
            reqs = [Request(f"r{i}", p, SamplingConfig(temperature=0.0, max_new_tokens=max_new, seed=0))
                    for i, p in enumerate(prompts[:c])]
            t0 = time.perf_counter()
            gens = engine.generate(reqs)
            wall = time.perf_counter() - t0
            outs[k] = [g.output_ids for g in gens]
            print(json.dumps({"c": c, "K": k, "tok_s": sum(map(len, outs[k])) / wall,
                              "target_s": engine.stats.target_forward_s, "draft_s": engine.stats.draft_forward_s,
                              "greedy_equal": outs[k] == outs[0], "kernel": target.model.layers[0].mlp.down.kind}),
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", default="", help="comma list (default: every kernel that runs here)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.max_new_tokens)
    from avkit.models import cpu_linear
    from engine_peer import machine  # bench/ is on sys.path when run as a script

    kernels = a.kernels.split(",") if a.kernels else cpu_linear.kinds()
    rows = []
    for r in range(a.rounds):
        for kernel in kernels:
            env = {**os.environ, "AVKIT_CPU_KERNEL": kernel}
            out = subprocess.run([sys.executable, __file__, "--child", "--max-new-tokens", str(a.max_new_tokens)],
                                 env=env, capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                if line.startswith("{"):
                    cell = json.loads(line)
                    rows.append(f"| {r + 1} | {kernel} | c={cell['c']} | {'target only' if cell['K'] == 0 else 'K=5'} | "
                                f"{cell['tok_s']:.2f} | {cell['target_s']:.1f} | {cell['draft_s']:.1f} | "
                                f"{'=' if cell['greedy_equal'] else 'differs'} | {os.getloadavg()[0]:.1f} |")
                    print(rows[-1], flush=True)
    head = [f"\n## {time.strftime('%Y-%m-%d %H:%M')} UTC — {machine()}, HumanEval, greedy, "
            f"{a.max_new_tokens} new tokens, bf16, kernels alternating within each round\n",
            "| round | kernel | c | config | tok/s incl. prefill | target forward s | draft forward s | "
            "K=5 output vs target-only | load |", "|---:|---|---|---|---:|---:|---:|---|---:|"]
    out = RESULTS / "cpu_kernels.md"
    text = out.read_text() if out.exists() else "# bench/cpu_kernels.py: the CPU linear kernels end to end\n"
    fd, tmp = tempfile.mkstemp(dir=RESULTS, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n".join(head + rows) + "\n")
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
