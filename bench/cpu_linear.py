"""The CPU bf16 linear kernel (avkit/models/cpu_linear.cpp) against PyTorch on the target's own shapes.

    python bench/cpu_linear.py                      # rows 1..128, the 1.5B target's four linear shapes + lm_head
    python bench/cpu_linear.py --rows 1,8 --shapes 8960x1536 --out -
    python bench/cpu_linear.py --bulk --rows 1,6,64,128,256 --no-fp32   # + the prefill path (cpu_bulk.py)

Per (weight shape, rows M) it times ``cpu_linear.linear`` and the peers PyTorch runs for the same call:
``F.linear`` in bf16 (what vLLM-CPU falls back to on a CPU without AVX512-BF16 / AMX) and in fp32 (fp32
weights: twice the bytes). Each timed call reads a different copy of the weight, cycling through >= 256 MB
of copies, so the weights stream from memory as in a forward (one copy would sit in the L3 cache and
overstate the bandwidth). ``--bulk`` adds the prefill path (avkit/models/cpu_bulk.py: oneDNN's pre-packed
bf16 matmul in 64-row calls) where this CPU has it (AMX / AVX512-BF16). Reports ms per call, GB/s of weight read and GFLOP/s, the median of --repeats,
with the 1-minute load beside it (compare within one run; a busy box slows every column). Appends a
Markdown table to bench/results/cpu_linear.md (temp file, then rename). Timings only, never pass/fail.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from avkit.models import cpu_bulk, cpu_linear
from engine_peer import machine  # bench/ is on sys.path when run as a script

# Qwen2.5-Coder-1.5B: q/k/v fused 1536 -> 2048, o 1536 -> 1536, gate+up 1536 -> 2 x 8960, down 8960 -> 1536,
# lm_head 1536 -> 151,936 (tied embedding)
SHAPES = "2048x1536,1536x1536,17920x1536,1536x8960,151936x1536"


def _time(fn, calls: int, repeats: int) -> float:
    """Median over repeats of the mean seconds per call."""
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls)
    return statistics.median(out)


def _cycler(tensors: list[torch.Tensor]):
    state = {"i": 0}

    def nxt() -> torch.Tensor:
        state["i"] = (state["i"] + 1) % len(tensors)
        return tensors[state["i"]]
    return nxt


def run(shapes: list[tuple[int, int]], rows: list[int], repeats: int, fp32: bool, bulk: bool, kind: str) -> list[str]:
    torch.manual_seed(0)
    lines = []
    for n, k in shapes:
        w = (torch.randn(n, k) * 0.02).bfloat16()
        copies = max(2, int(256e6 // (n * k * 2)))
        packed = _cycler([cpu_linear.pack(w, kind) for _ in range(copies)])
        plain = _cycler([w.clone() for _ in range(copies)])
        wide = _cycler([w.float() for _ in range(max(2, copies // 2))]) if fp32 else None
        onednn = _cycler([cpu_bulk.pack(w) for _ in range(copies)]) if bulk else None
        mb = n * k * 2 / 1e6
        for m in rows:
            x = torch.randn(m, k).bfloat16()
            calls = max(2, min(50, int(2e9 / (n * k * max(m, 4)))))
            ours = _time(lambda x=x, n=n, packed=packed: cpu_linear.linear(x, packed(), None, n, kind), calls, repeats)
            tbf = _time(lambda x=x, plain=plain: F.linear(x, plain()), max(1, calls // 4), repeats) if m <= 64 else float("nan")
            xf = x.float()
            t32 = _time(lambda xf=xf, wide=wide: F.linear(xf, wide()), calls, repeats) if fp32 else float("nan")
            tbk = _time(lambda x=x, onednn=onednn: cpu_bulk.linear(x, onednn(), None), calls, repeats) if bulk \
                else float("nan")
            gf = 2 * m * n * k / 1e9
            lines.append(f"| {n}x{k} | {m} | {ours * 1e3:.2f} | {mb / 1e3 / ours:.1f} | {gf / ours:.0f} | "
                         f"{tbf * 1e3:.2f} | {t32 * 1e3:.2f} | {tbf / ours:.1f}x | {t32 / ours:.1f}x | "
                         f"{tbk * 1e3:.2f} | {gf / tbk:.0f} | {os.getloadavg()[0]:.1f} |")
            print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--shapes", default=SHAPES, help="NxK,... (out x in features)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-fp32", action="store_true", help="skip the fp32 F.linear column")
    ap.add_argument("--bulk", action="store_true", help="add the prefill path's columns (oneDNN, cpu_bulk.py)")
    ap.add_argument("--kind", default="", help="avkit's kernel: avx2 or avx512_bf16 (default: cpu_linear.default_kind())")
    ap.add_argument("--out", default="bench/results/cpu_linear.md", help="Markdown file to append to, - = stdout only")
    a = ap.parse_args()
    if not cpu_linear.available():
        sys.exit("cpu_linear kernel unavailable here (needs an AVX2 CPU and a C++ compiler)")
    if a.bulk and not cpu_bulk.available():
        sys.exit("--bulk: oneDNN has no bf16 fast path on this CPU (needs AMX or AVX512-BF16)")
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    rows = [int(r) for r in a.rows.split(",")]
    head = [f"\n## {time.strftime('%Y-%m-%d %H:%M')} — {machine()}, "
            f"{torch.get_num_threads()} threads, torch {torch.__version__}, avkit kernel {a.kind or cpu_linear.default_kind()}\n",
            "| weight N x K | rows M | avkit ms | avkit GB/s | avkit GFLOP/s | F.linear bf16 ms | F.linear fp32 ms "
            "| bf16 / avkit | fp32 / avkit | oneDNN bulk ms | bulk GFLOP/s | load |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(head), flush=True)
    kind = a.kind or cpu_linear.default_kind()
    if kind not in cpu_linear.kinds():
        sys.exit(f"--kind {kind}: not available here (have {cpu_linear.kinds()})")
    lines = run(shapes, rows, a.repeats, not a.no_fp32, a.bulk, kind)
    if a.out != "-":
        out = Path(a.out)
        text = (out.read_text() if out.exists() else "# CPU bf16 linear: avkit's kernel vs PyTorch\n"
                "\n`python bench/cpu_linear.py` (see its docstring). Weights stream from memory (copies > L3).\n")
        tmp = out.with_suffix(".tmp")
        tmp.write_text(text + "\n".join(head + lines) + "\n")
        tmp.replace(out)


if __name__ == "__main__":
    main()
