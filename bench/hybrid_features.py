"""Hybrid drafter: microseconds per step of its payoff features along one long request, before and after.

    python bench/hybrid_features.py [--prompt 1000] [--output 8000] [--before 60128be~1]

"before" is `avkit/hvd/hybrid_drafter.py` as of the git revision `--before` (it searched prompt +
output for `in_prompt` / `in_output` every step and copied the output: O(n) per step), loaded from
git into its own module; "after" is this checkout's (suffix automata extended per token). Both
drive the same synthetic code-like request (70% copies of earlier spans, so the cache drafts) one
token per step through `features`, the router's input; the table gives the mean per step in
windows of the output position and the after/before ratio. Timings never gate tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from avkit.config import SuffixCacheConfig
from avkit.drafters.base import DraftInput
from avkit.hvd.hybrid_drafter import HybridDrafter

K = 7


def _stream(rng, n: int, vocab: int) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        if out and rng.random() < 0.7:  # copy a span of what came before
            i = int(rng.integers(0, max(len(out) - 16, 1)))
            out.extend(out[i:i + int(rng.integers(4, 16))])
        else:
            out.append(int(rng.integers(0, vocab)))
    return out[:n]


def _load_before(rev: str):
    """The hybrid drafter module at `rev`, imported under its own name."""
    src = subprocess.run(["git", "show", f"{rev}:avkit/hvd/hybrid_drafter.py"], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent).stdout
    path = Path(tempfile.mkdtemp()) / "hybrid_drafter_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("hybrid_drafter_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.HybridDrafter


def _per_step(cls, prompt: list[int], output: list[int], vocab: int) -> np.ndarray:
    """Seconds of `features` at each output position of one request."""
    live = cls(None, None, tau=0.0, cache_config=SuffixCacheConfig(), vocab_size=vocab, k=K)
    seq = list(prompt)  # the engine's own growing list: no harness copy per step
    one = torch.ones(1)
    inp = DraftInput(torch.zeros(1, dtype=torch.int64), [seq], torch.full((1,), K), one, one,
                     torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), torch.zeros(1))
    times = np.zeros(len(output))
    for t, tok in enumerate(output):
        t0 = time.perf_counter()
        live.features(inp)
        times[t] = time.perf_counter() - t0
        seq.append(tok)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=1000)
    ap.add_argument("--output", type=int, default=8000)
    ap.add_argument("--vocab", type=int, default=30000)
    ap.add_argument("--before", default="60128be~1", help="git revision of the 'before' drafter")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    text = _stream(rng, args.prompt + args.output, args.vocab)
    prompt, output = text[: args.prompt], text[args.prompt:]
    before = _per_step(_load_before(args.before), prompt, output, args.vocab)
    after = _per_step(HybridDrafter, prompt, output, args.vocab)
    edges = [0, 500, 1000, 2000, 4000, 8000, 16000, 32000]
    edges = [e for e in edges if e < len(output)] + [len(output)]
    print(f"hybrid drafter features, one request: prompt {args.prompt}, output {args.output} tokens, K = {K}")
    print(f"{'output positions':>18} {'before us/step':>15} {'after us/step':>14} {'after/before':>13}")
    for lo, hi in itertools.pairwise(edges):
        b, a = before[lo:hi].mean() * 1e6, after[lo:hi].mean() * 1e6
        print(f"{f'{lo}-{hi}':>18} {b:15.1f} {a:14.1f} {a / b:13.2f}")
    print(f"{'whole request':>18} {before.sum():14.2f}s {after.sum():13.2f}s {after.sum() / before.sum():13.2f}")


if __name__ == "__main__":
    main()
