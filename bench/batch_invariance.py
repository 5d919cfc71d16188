"""The CPU backend's batch-invariant attention on the real pair (bf16): forward time and greedy exactness.

    python bench/batch_invariance.py                   # real pair, bf16, ~6 min on 2 cores (`just bench-invariance`)
    python bench/batch_invariance.py --tiny            # dry run on tiny random models (checks the script)

Two attentions, same weights, same process: ``invariant`` (cpu_attention.py, each query row over its own
span; the default) and ``sdpa`` (torch's SDPA with the [B, 1, G*S, span] mask, as before issue 17).

1. Forward time: the target's forward at B rows x S query tokens (S = 1 decode, S = 8 a K = 7 verify) after
   `--context` cached tokens, both attentions interleaved, `--repeats` forwards each; median ms and the ratio.
2. Greedy exactness: the first `--concurrency` HumanEval prompts (target chat template, T = 0, 64 new tokens)
   decoded target-only and with the draft model at K = `--k`, with each attention; prints which requests'
   speculative output differs from that attention's own target-only output, token for token.

Appends to bench/results/batch_invariance.md (temp file, then rename; not with --tiny). Timings only, never pass/fail.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import avkit.models
from avkit.config import DEFAULT_DRAFT, DEFAULT_TARGET, EngineConfig, SamplingConfig
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request

RESULTS = Path(__file__).parent / "results"
MODES = ("invariant", "sdpa")


def _set_mode(model, mode: str, on: bool) -> None:
    model.cpu_attention = on and mode == "invariant"


def forward_times(model, batch: int, s: int, context: int, repeats: int, on: bool) -> dict[str, float]:
    """Median ms per forward of each attention, interleaved (each repeat runs both on the same cache state)."""
    g = torch.Generator().manual_seed(0)
    cache = model.new_cache(batch, context + s + 1)
    slots = torch.arange(batch)
    prompt = torch.randint(0, model.config.vocab_size, (batch, context), generator=g)
    model.forward(prompt, torch.full((batch,), context), slots, cache, logits=torch.zeros(batch, 0, dtype=torch.int64))
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(repeats + 1):  # the first round warms up, untimed
        for mode in MODES:
            _set_mode(model, mode, on)
            t = torch.randint(0, model.config.vocab_size, (batch, s), generator=g)
            t0 = time.perf_counter()
            model.forward(t, torch.full((batch,), s), slots, cache, logits="all")
            if r:
                times[mode].append((time.perf_counter() - t0) * 1e3)
            cache.truncate(slots, torch.full((batch,), context))
    _set_mode(model, "invariant", on)
    return {m: statistics.median(v) for m, v in times.items()}


def greedy(target, draft, prompts: list[list[int]], k: int, max_new: int, mode: str, on: bool) -> list[list[int]]:
    _set_mode(target.model, mode, on)
    _set_mode(draft.model, mode, on)
    max_len = max(len(p) for p in prompts) + max_new + k + 2
    engine = Engine(target, draft if k else None, EngineConfig(k=k, max_batch=len(prompts), max_len=max_len))
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=max_new, seed=0)
    gens = engine.generate([Request(f"b{i}", p, sampling, dataset="humaneval") for i, p in enumerate(prompts)])
    return [g.output_ids for g in gens]


def _hf_line(path: str, prompt: list[int], ours: list[int], max_new: int) -> str:
    """HF transformers' own greedy generate in bf16 (prefill, then one-token KV-cached decodes) vs ours."""
    import transformers

    t0 = time.perf_counter()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        ids = hf.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
    n = min(len(ids), len(ours))
    first = next((j for j in range(n) if ids[j] != ours[j]), None)
    same = f"identical on {n} tokens" if first is None else f"first difference at token {first} of {n}"
    return (f"\nHF transformers {transformers.__version__} greedy (bf16, generate with its KV cache) vs avkit "
            f"target-only, prompt 0: {same} ({time.perf_counter() - t0:.0f} s).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--draft", default=DEFAULT_DRAFT)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--shapes", default="1x1,1x8,4x1,4x8", help="B x S forwards to time")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--tiny", action="store_true", help="tiny random bf16 models (a dry run of the script)")
    ap.add_argument("--hf", default="", help="also HF transformers' greedy (bf16, KV-cached generate) on the first "
                    "prompt from this HF directory of the target, vs avkit's target-only output")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load = lambda p: avkit.models.load(p, dtype=torch.bfloat16)
    if args.tiny:
        from avkit.models.testing import write_tiny_model

        root = Path(tempfile.mkdtemp(prefix="avkit-bench-"))
        target = load(write_tiny_model(root / "t", vocab=512, seed=0, hidden=128, heads=4, intermediate=256,
                                       init_std=0.3))
        draft = load(write_tiny_model(root / "d", vocab=512, seed=1, hidden=128, heads=4, intermediate=256,
                                      init_std=0.3))
        prompts = [target.tokenizer.encode(f"def f{i}(x):\n    return x * {i}\n") for i in range(args.concurrency)]
    else:
        from avkit.workloads import load_workload

        target, draft = load(args.target), load(args.draft)
        prompts = [target.tokenizer.apply_chat_template(list(p.messages))
                   for p in load_workload("humaneval", n=args.concurrency, seed=0)]
    on = target.model.cpu_attention  # False where the kernel does not build: both modes are then SDPA
    out = [f"## {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC: {target.model_id} (draft {draft.model_id}), bf16, "
           f"{args.threads} threads, invariant kernel {'on' if on else 'UNAVAILABLE'}, load "
           f"{os.getloadavg()[0]:.1f}\n",
           f"Forward ms (median of {args.repeats}, interleaved) after {args.context} cached tokens, logits at every "
           "position:\n", "| B x S | invariant ms | SDPA ms | invariant / SDPA |", "|---|---:|---:|---:|"]
    print("\n".join(out), flush=True)
    for shape in args.shapes.split(","):
        b, s = (int(x) for x in shape.split("x"))
        t = forward_times(target.model, b, s, args.context, args.repeats, on)
        out.append(f"| {b} x {s} | {t['invariant']:.1f} | {t['sdpa']:.1f} | {t['invariant'] / t['sdpa']:.3f} |")
        print(out[-1], flush=True)
    out += ["", f"Greedy, first {args.concurrency} HumanEval prompts at c{args.concurrency}, T = 0, "
                f"{args.max_new_tokens} new tokens, K = {args.k} vs target-only (same attention):\n",
            "| attention | requests whose K output differs from target-only | first differing token index |",
            "|---|---|---|"]
    print("\n".join(out[-4:]), flush=True)
    outputs = {}
    for mode in MODES:
        ref = greedy(target, draft, prompts, 0, args.max_new_tokens, mode, on)
        spec = greedy(target, draft, prompts, args.k, args.max_new_tokens, mode, on)
        outputs[mode] = ref
        bad = [i for i, (a, c) in enumerate(zip(ref, spec)) if a != c]
        first = [next((j for j, (x, y) in enumerate(zip(ref[i], spec[i])) if x != y), min(len(ref[i]), len(spec[i])))
                 for i in bad]
        out.append(f"| {mode} | {len(bad)} of {len(prompts)} {bad} | {first} |")
        print(out[-1], flush=True)
    if args.hf:
        out.append(_hf_line(args.hf, prompts[0], outputs["invariant"][0], args.max_new_tokens))
        print(out[-1], flush=True)
    same = sum(a == b for a, b in zip(outputs["invariant"], outputs["sdpa"]))
    out.append(f"\nTarget-only outputs, invariant vs SDPA attention: {same} of {len(prompts)} identical. "
               f"Load at the end {os.getloadavg()[0]:.1f}.\n")
    print(out[-1], flush=True)
    if args.tiny:  # a dry run writes nothing
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "batch_invariance.md"
    old = path.read_text() if path.exists() else "# bench/batch_invariance.py\n\n"
    fd, tmp = tempfile.mkstemp(dir=RESULTS, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(old + "\n".join(out) + "\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
