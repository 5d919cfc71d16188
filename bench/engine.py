"""Engine throughput on this CPU: target-only vs speculative decoding, side by side in one run.

Usage (real pair, ~10 GB RAM, tens of minutes on 2 cores; run when nothing else loads the models):

    python bench/engine.py                          # K = 0,3,5,7 x T = 0,1 x concurrency 1,8
    python bench/engine.py --ks 0,5 --concurrency 1 --max-new-tokens 32
    python bench/engine.py --tiny                   # dry run on tiny random models (checks the script)
    python bench/engine.py --overhead               # engine ms/step outside forwards, stub models, V = 151,936
    python bench/engine.py --peer vllm --ks 0,5 --concurrency 1,4 --temperatures 0 --adaptive
                                                    # avkit vs vLLM-CPU, same prompts and weights (`just peer-vllm`)

For each temperature and concurrency c it decodes the first c HumanEval prompts (chat template of
the target, top-p 0.95, fixed seed) with every K (K = 0 is target-only decoding through the same
engine) and prints: output tokens/s, tokens per request-step, per-slot acceptance (labelled slots),
and the share of step wall time spent outside model forwards (goal: < 10% at batch 8). The table
is written to bench/results/engine-<date>.md (temp file, then rename). Timings only, never pass/fail.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import avkit.models
from avkit.config import DEFAULT_DRAFT, DEFAULT_TARGET, EngineConfig, SamplingConfig
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.runtime.trace_rows import MemorySink
from common import RESULTS, header, today, write  # bench/ is on sys.path when run as a script

VLLM_THREADS = "VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 VLLM_CPU_KVCACHE_SPACE=2"


def _prompts(tokenizer, n: int, tiny: bool) -> list[list[int]]:
    if tiny:
        return [tokenizer.encode(f"def f{i}(x):\n    return x * {i}\n") for i in range(n)]
    from avkit.workloads import load_workload

    prompts = load_workload("humaneval", n=n, seed=0)
    return [tokenizer.apply_chat_template(list(p.messages)) for p in prompts]


def _run(target, draft, prompts, k: int, temperature: float, max_new: int, seed: int) -> dict:
    max_len = max(len(p) for p in prompts) + max_new + k + 2
    sink = MemorySink()
    engine = Engine(target, draft if k > 0 else None,
                    EngineConfig(k=k, concurrency=len(prompts), max_len=max_len, seed=seed), sink=sink)
    sampling = SamplingConfig(temperature=temperature, top_p=0.95, max_new_tokens=max_new, seed=seed)
    reqs = [Request(f"bench{i}", p, sampling, dataset="humaneval") for i, p in enumerate(prompts)]
    t0 = time.perf_counter()
    gens = engine.generate(reqs)
    wall = time.perf_counter() - t0
    tokens = sum(len(g.output_ids) for g in gens)
    request_steps = sum(g.num_steps for g in gens)
    rows = sink.columns()
    acc = rows["accepted"].compressed().mean() if rows else float("nan")
    s = engine.stats
    return {"tok_s": tokens / wall, "tokens_per_step": tokens / max(request_steps, 1),
            "acceptance": float(acc), "outside_forwards": s.overhead_share, "wall_s": wall, "tokens": tokens}


def _tiny_pair():
    from avkit.models.testing import write_tiny_model

    root = Path(tempfile.mkdtemp(prefix="avkit-bench-"))
    return (avkit.models.load(write_tiny_model(root / "t", vocab=512, seed=0, init_std=0.3)),
            avkit.models.load(write_tiny_model(root / "d", vocab=512, seed=1, init_std=0.3)))


class _LogitsStub:
    """A "model" whose forward only draws peaky random logits over a real-size vocabulary: timing the
    engine with it measures the engine's own per-step cost (sampling, features, verification, rows)."""

    def __init__(self, vocab: int, seed: int):
        from types import SimpleNamespace

        self.config = SimpleNamespace(vocab_size=vocab)
        self.g = torch.Generator().manual_seed(seed)

    def new_cache(self, max_batch: int, max_len: int):
        from avkit.models.kv_cache import KVCache

        return KVCache(1, max_batch, 1, max_len, 1)

    def forward(self, tokens, q_lens, slots, cache, logits="all", *, host=None, prefill=False):  # the Transformer's
        cache.lengths[slots] += q_lens
        B, S = tokens.shape
        shape = (B, self.config.vocab_size) if isinstance(logits, str) and logits == "last" else (
            (B, S, self.config.vocab_size) if isinstance(logits, str) else (B, logits.shape[1], self.config.vocab_size))
        return torch.randn(shape, generator=self.g) * 4.0


def overhead(vocab: int, max_new: int) -> None:
    """Engine ms per step outside model forwards (stub models, real vocabulary), K = 7."""
    from types import SimpleNamespace

    def stub(seed):
        return SimpleNamespace(model=_LogitsStub(vocab, seed), tokenizer=SimpleNamespace(eos_token_ids=set()),
                               model_id=f"stub{seed}", sha256="")

    print(f"| T | batch | engine ms/step outside forwards (V = {vocab}, K = 7) |")
    for temperature in (0.0, 1.0):
        for batch in (1, 8):
            engine = Engine(stub(0), stub(1), EngineConfig(k=7, concurrency=batch, max_len=64 + max_new + 9),
                            sink=MemorySink())
            sampling = SamplingConfig(temperature=temperature, top_p=0.95, max_new_tokens=max_new, seed=0)
            engine.generate([Request(f"o{i}", list(range(1, 33)), sampling) for i in range(batch)])
            s = engine.stats
            outside = (s.step_s - s.target_forward_s - s.draft_forward_s) / s.steps * 1e3
            print(f"| {temperature:g} | {batch} | {outside:.1f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--draft", default=DEFAULT_DRAFT)
    ap.add_argument("--ks", default="0,3,5,7")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"),
                    help="both models (bfloat16: as the shipped traces were recorded; ~3x fp32 on AVX512-BF16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="tiny random models (a dry run of the script)")
    ap.add_argument("--overhead", action="store_true",
                    help="only the engine's own cost per step, with stub models of a 151,936-token vocabulary")
    peer = ap.add_argument_group("--peer vllm (bench/engine_peer.py)")
    peer.add_argument("--peer", choices=("vllm",), help="run vLLM-CPU on the same prompts and weights, print ratios")
    peer.add_argument("--datasets", default="humaneval", help="comma-separated workloads (humaneval, sharegpt, ...)")
    peer.add_argument("--repeats", type=int, default=1, help="alternating vLLM / avkit phases")
    peer.add_argument("--engines", default="vllm,avkit",
                      help="phases to run (the day's JSON keeps the other engine's cells: add them in a later run)")
    peer.add_argument("--adaptive", action="store_true", help="add avkit's adaptive policy (engine k = max K)")
    peer.add_argument("--cost", default="", help="adaptive: reuse this cost table instead of profiling this CPU")
    peer.add_argument("--coefficients", default="traces/coefficients.json", help="adaptive: estimator warm start")
    peer.add_argument("--target-dir", default="", help="bf16 safetensors dir of the target (default: models cache)")
    peer.add_argument("--draft-dir", default="", help="bf16 safetensors dir of the draft (default: models cache)")
    peer.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    peer.add_argument("--vllm-compile", action="store_true", help="let vLLM compile (default: eager, faster start)")
    peer.add_argument("--vllm-dtype", default="", choices=("", "float32", "bfloat16"),
                      help="vLLM's dtype (default: --dtype); on AVX2 without AVX512-BF16 vLLM-CPU's float32 "
                           "beat its bf16 (2026-12-05, c4: 6.03 vs 1.47 tok/s)")
    peer.add_argument("--vllm-fix-expand", action="store_true",
                      help="fix vLLM-CPU 0.32's T > 0 speculative bug in the peer (avkit/engines/vllm/cpu_fix.py)")
    peer.add_argument("--rewrite", action="store_true", help="run nothing: rewrite the day's table from its JSON")
    peer.add_argument("--vllm-timeout", type=int, default=3600, help="seconds per vLLM process")
    peer.add_argument("--only-ks", action="store_true",
                      help="measure --ks only (default: K = 0 too); e.g. one cell again, the day's JSON keeps the rest")
    peer.add_argument("--fresh", action="store_true",
                      help="start the day's results over (default: add these cells to engine-vllm-<date>.json)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.overhead:
        return overhead(151936, args.max_new_tokens)
    if args.peer:
        return _peer(args)
    t0 = time.perf_counter()
    target, draft = _tiny_pair() if args.tiny else (
        avkit.models.load(args.target, dtype=getattr(torch, args.dtype)),
        avkit.models.load(args.draft, dtype=getattr(torch, args.dtype)))
    print(f"loaded target={target.model_id} draft={draft.model_id} in {time.perf_counter() - t0:.0f} s, "
          f"threads={args.threads}")
    ks = [int(x) for x in args.ks.split(",")]
    temps = [float(x) for x in args.temperatures.split(",")]
    concs = [int(x) for x in args.concurrency.split(",")]
    prompts = _prompts(target.tokenizer, max(concs), args.tiny)
    for k in sorted({0, max(ks)}):  # warm-up: first-touch allocations and kernel selection are not timed
        _run(target, draft, prompts[:max(concs)], k, 1.0, 8, args.seed)
    header = "| T | concurrency | K | tokens/s | speedup | tokens/step | acceptance | outside forwards | wall s |"
    lines = [header, "|" + "---|" * 9]
    print(header)
    for temperature in temps:
        for c in concs:
            base = None
            for k in ks:
                r = _run(target, draft, prompts[:c], k, temperature, args.max_new_tokens, args.seed)
                base = r["tok_s"] if k == 0 else base
                speedup = f"{r['tok_s'] / base:.2f}x" if base else "-"
                line = (f"| {temperature:g} | {c} | {k} | {r['tok_s']:.2f} | {speedup} | "
                        f"{r['tokens_per_step']:.2f} | {r['acceptance']:.3f} | {100 * r['outside_forwards']:.1f}% | "
                        f"{r['wall_s']:.0f} |")
                lines.append(line)
                print(line, flush=True)
    _write(lines, args)


def _peer(args) -> None:
    """Run the peer grid, merge its cells into the day's JSON, rewrite the markdown table from all cells."""
    import json

    from engine_peer import main_peer, merge, table

    path = RESULTS / f"engine-vllm-{today()}.json"
    old = [] if args.fresh or not path.exists() else json.loads(path.read_text())["cells"]

    def save(new: list[dict]) -> None:
        all_cells = merge(old, new)
        lines = table(all_cells)
        args.datasets = ",".join(sorted({c["dataset"] for c in all_cells}))  # the header names every run's prompts
        print("\n".join(lines))
        _write(lines, args, prefix="engine-vllm-", extra={path: json.dumps({"fields": CELL_FIELDS, "cells": all_cells})})

    if args.rewrite:  # no run: the table again from the day's cells (e.g. after the table's format changed)
        return save([])
    new = main_peer(args, on_phase=save)
    if old:
        print(f"merged {len(new)} new cells with {len(old)} from {path}")


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


def _write(lines: list[str], args, prefix: str = "engine-", extra: dict | None = None) -> None:
    """The markdown table (plus ``extra`` {path: text}), each to a temp file, all renamed at the end."""
    name = f"{prefix}{'tiny-' if args.tiny else ''}{today()}.md"
    peer = (f"vLLM-CPU 0.32 peer ({args.vllm_dtype or args.dtype}, eager={not args.vllm_compile}, {VLLM_THREADS})"
            if "vllm" in args.engines.split(",") else "avkit only (no vLLM phase)") if args.peer else ""
    what = (f"`{args.datasets}` prompts, {peer}, {args.repeats} alternating repeat(s), adaptive from "
            f"`{args.coefficients}`" if args.peer else "HumanEval prompts")
    body = header("bench/engine.py") + "\n".join([
        f"target `{args.target}`, draft `{args.draft}`, {what}, top-p 0.95, max_new_tokens {args.max_new_tokens}, "
        f"dtype {args.dtype}, threads {args.threads}", "", *lines, ""])
    write({RESULTS / name: body, **(extra or {})})


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
