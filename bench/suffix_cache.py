"""Suffix cache drafter: microseconds per append and per draft, and memory (trie nodes, bytes, and
bytes per cached token of the global tree: exact by a sys.getsizeof walk, and the NODE_BYTES estimate
that /metrics reports).

    python bench/suffix_cache.py [--prompt 2000] [--output 500] [--requests 50]   # -> bench/results/suffix_cache.md

A synthetic code-like stream (70% copies of earlier spans) drives one live request after
`--requests` finished ones fill the global tree. Prints and writes a table; timings never gate tests.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from avkit.config import SuffixCacheConfig
from avkit.hvd.suffix_cache import SuffixCache
from common import RESULTS, header, write  # bench/ is on sys.path when run as a script


def _stream(rng, base: list[int], n: int) -> list[int]:
    out = []
    while len(out) < n:
        if rng.random() < 0.7:  # copy a span of the base text
            i = int(rng.integers(0, len(base) - 16))
            out.extend(base[i:i + int(rng.integers(4, 16))])
        else:
            out.append(int(rng.integers(0, 30000)))
    return out[:n]


def run(prompt_len: int, output_len: int, requests: int, max_depth: int, traced: bool) -> dict[str, float]:
    """One timed pass (traced=False) or one memory pass (traced=True: tracemalloc slows it ~5x)."""
    rng = np.random.default_rng(0)
    cfg = SuffixCacheConfig(max_depth=max_depth)
    base = rng.integers(0, 30000, prompt_len).tolist()
    if traced:
        tracemalloc.start()
    cache = SuffixCache(cfg)
    for r in range(requests):  # fill the global tree with past responses
        cache.start_request(f"past{r}", base[:64])
        cache.append(f"past{r}", _stream(rng, base, output_len))
        cache.finish_request(f"past{r}")
    t0 = time.perf_counter()
    cache.start_request("live", base)
    t_prompt = time.perf_counter() - t0
    out = _stream(rng, base, output_len)
    t_draft = t_append = 0.0
    drafted = 0
    for tok in out:
        t0 = time.perf_counter()
        d = cache.draft("live", k=7)
        t1 = time.perf_counter()
        cache.append("live", [tok])
        t_append += time.perf_counter() - t1
        t_draft += t1 - t0
        drafted += d.draft_len
    mem = tracemalloc.get_traced_memory()[0] if traced else float("nan")
    tracemalloc.stop()
    g = cache.memory()
    return {
        "global_tokens": g["global_tokens"],
        "global_nodes_per_token": g["global_nodes"] / max(g["global_tokens"], 1),
        "global_bytes_per_token_exact": cache.global_trie.deep_bytes() / max(g["global_tokens"], 1),
        "global_bytes_per_token_estimate": g["bytes_per_cached_token"],
        "prompt_us_per_token": 1e6 * t_prompt / prompt_len,
        "append_us": 1e6 * t_append / output_len,
        "draft_us": 1e6 * t_draft / output_len,
        "mean_draft_len": drafted / output_len,
        "nodes": cache.num_nodes,
        "mib": mem / 2**20,
        "bytes_per_node": mem / cache.num_nodes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=2000)
    ap.add_argument("--output", type=int, default=500)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--max-depth", type=int, default=SuffixCacheConfig.max_depth)
    ap.add_argument("--out", default=str(RESULTS / "suffix_cache.md"))
    a = ap.parse_args()
    res = run(a.prompt, a.output, a.requests, a.max_depth, traced=False)
    mem = run(a.prompt, a.output, a.requests, a.max_depth, traced=True)
    res.update(mib=mem["mib"], bytes_per_node=mem["bytes_per_node"])  # tracemalloc: every allocation of the cache
    lines = [f"Prompt {a.prompt} tokens, output {a.output} tokens, {a.requests} cached responses, max_depth "
             f"{a.max_depth}; `mib` and `bytes_per_node` by tracemalloc (a second, traced pass).", "",
             "| measure | value |", "|---|---:|", *(f"| {k} | {v:.2f} |" for k, v in res.items())]
    print("\n".join(lines))
    write({a.out: header("Suffix cache drafter: time per token and memory (bench/suffix_cache.py)") +
           "\n".join(lines) + "\n"})


if __name__ == "__main__":
    main()
