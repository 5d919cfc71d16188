"""Forward-pass timings of one model on this CPU: prefill, batch-1 decode step, batch-8 x 8-token verify step.

Usage: ``python bench/models_forward.py [model] [--threads N]`` (default: the target alias).
Prints one table: median seconds per call and tokens/s. Timings only, never pass/fail.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import avkit.models
from avkit.config import DEFAULT_TARGET


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=DEFAULT_TARGET)
    ap.add_argument("--threads", default=str(torch.get_num_threads()), help="comma list, e.g. 1,2")
    ap.add_argument("--context", type=int, default=256, help="tokens already in the cache per row")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    t0 = time.perf_counter()
    model = avkit.models.load(args.model).model
    load_s = time.perf_counter() - t0
    cache = model.new_cache(8, args.context + 64)
    ctx = torch.randint(0, 1000, (8, args.context))
    slots8 = torch.arange(8)
    prefill_s = _median_time(lambda: (cache.truncate(slots8, torch.zeros(8, dtype=torch.int64)),
                                      model.forward(ctx[:1], torch.tensor([args.context]), slots8[:1], cache,
                                                    logits="last")), 1)
    for b in range(8):  # fill every slot to the same context
        cache.free(b)
    model.forward(ctx, torch.full((8,), args.context), slots8, cache, logits="last")
    base = cache.lengths.clone()

    def decode1():
        model.forward(torch.tensor([[7]]), torch.tensor([1]), slots8[:1], cache, logits="last")
        cache.truncate(slots8, base)

    def verify8():
        model.forward(torch.randint(0, 1000, (8, 8)), torch.full((8,), 8), slots8, cache, logits="all")
        cache.truncate(slots8, base)

    print(f"model={args.model} context={args.context} load_s={load_s:.1f} prefill(1 x {args.context})_s="
          f"{prefill_s:.2f}")
    print(f"{'threads':<8}{'call':<28}{'median s':>10}{'tokens/s':>10}")
    for threads in map(int, args.threads.split(",")):
        torch.set_num_threads(threads)
        d1 = _median_time(decode1, args.repeats)
        v8 = _median_time(verify8, args.repeats)
        print(f"{threads:<8}{'decode 1 x 1':<28}{d1:>10.3f}{1 / d1:>10.2f}")
        print(f"{threads:<8}{'verify 8 x 8 (all logits)':<28}{v8:>10.3f}{64 / v8:>10.1f}")


if __name__ == "__main__":
    main()
