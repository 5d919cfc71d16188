"""Where a forward's time goes: torch.profiler over the target's decode and verify forwards.

    python bench/forward_profile.py                          # target, bf16, context 256, B = 1, 4; S = 1, 6
    AVKIT_CPU_KERNELS=0 python bench/forward_profile.py      # the same with the plain F.linear path

For each (B rows, S query tokens per row: S = 1 is target-only decoding, S = 6 a K = 5 verify) it fills
the cache to the context length, then profiles `--steps` forwards (logits at every position, as the
engine's verify asks) and prints the top operators by self CPU time plus wall and process-CPU ms per
forward (on a shared box the CPU time is the steadier number). First it profiles one prefill of
`--context` tokens (the engine's prefill forward: no logits, oneDNN's bulk path where cpu_bulk.py runs). Appends the tables to
bench/results/forward_profile.md (temp file, then rename).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

import avkit.models
from avkit.config import DEFAULT_TARGET
from avkit.models import cpu_bulk
from engine_peer import machine  # bench/ is on sys.path when run as a script

RESULTS = Path(__file__).parent / "results"


def profile(model, batch: int, s: int, context: int, steps: int) -> str:
    cache = model.new_cache(batch, context + s * (steps + 2) + 2)
    slots = torch.arange(batch)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (batch, context), generator=g)
    model.forward(tokens, torch.full((batch,), context), slots, cache, logits=torch.zeros(batch, 0, dtype=torch.int64),
                  prefill=True)

    def step():
        t = torch.randint(0, model.config.vocab_size, (batch, s), generator=g)
        return model.forward(t, torch.full((batch,), s), slots, cache, logits="all")

    step()  # warm-up
    w0, c0 = time.perf_counter(), time.process_time()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    wall, cpu = (time.perf_counter() - w0) / steps * 1e3, (time.process_time() - c0) / steps * 1e3
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=16)
    head = (f"### B = {batch}, S = {s}, context {context}: {wall:.1f} ms wall, {cpu:.1f} ms process CPU per "
            f"forward ({torch.get_num_threads()} threads; load {os.getloadavg()[0]:.1f})")
    return f"{head}\n\n```\n{table}```\n"


def profile_prefill(model, context: int) -> str:
    """One engine prefill forward of ``context`` tokens (B = 1, no logits), after an untimed one."""
    cache = model.new_cache(1, context + 2)
    slot, none = torch.zeros(1, dtype=torch.int64), torch.zeros(1, 0, dtype=torch.int64)
    tokens = torch.randint(0, model.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(0))

    def fill():
        cache.free(0)
        model.forward(tokens, torch.tensor([context]), slot, cache, logits=none, prefill=True)

    fill()  # warm-up
    w0, c0 = time.perf_counter(), time.process_time()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fill()
    wall, cpu = (time.perf_counter() - w0) * 1e3, (time.process_time() - c0) * 1e3
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
    head = (f"### prefill 1 x {context}: {wall:.1f} ms wall, {cpu:.1f} ms process CPU "
            f"({torch.get_num_threads()} threads; load {os.getloadavg()[0]:.1f})")
    return f"{head}\n\n```\n{table}```\n"


def _label_packed_linears() -> None:
    """Name the custom kernel in the profile: it is not a registered torch op, so it would show as a gap."""
    from avkit.models import cpu_linear

    plain = cpu_linear.PackedLinear.forward

    def forward(self, x, bulk=False):
        path = "onednn_bulk" if bulk and self.bulk_weight is not None else "linear_bf16"
        with torch.profiler.record_function(f"avkit::{path} [{self.out_features}x{self.in_features}]"):
            return plain(self, x, bulk)

    cpu_linear.PackedLinear.forward = forward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_TARGET)
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--queries", default="1,6")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    _label_packed_linears()
    m = avkit.models.load(args.model, dtype=getattr(torch, args.dtype))
    packed = any(type(mod).__name__ == "PackedLinear" for mod in m.model.modules())
    parts = [f"## {m.model_id}, {args.dtype}, CPU kernels {'on' if packed else 'off'}, oneDNN bulk prefill "
             f"{'on' if cpu_bulk.available() and packed else 'off'}; {machine()}\n",
             profile_prefill(m.model, args.context)]
    print(parts[-1], flush=True)
    for b in (int(x) for x in args.batches.split(",")):
        for s in (int(x) for x in args.queries.split(",")):
            parts.append(profile(m.model, b, s, args.context, args.steps))
            print(parts[-1], flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "forward_profile.md"
    old = out.read_text() if out.exists() else "# bench/forward_profile.py\n\n"
    fd, tmp = tempfile.mkstemp(dir=RESULTS, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(old + "\n".join(parts))
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
