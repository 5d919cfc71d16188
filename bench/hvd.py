"""Hybrid Verified Decoding on avkit's own traces (bench/README.md: usage): the replay, every router fitted and
scored under each cost model -> bench/results/hvd.md; `--suffix-cache`: the suffix cache drafter's time and
memory -> suffix_cache.md; `live`: live HVD against its replay's prediction -> hvd_live.md (bench/hvd_live.py).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import tracemalloc

import numpy as np
import polars as pl

from avkit.config import HvdCostConfig, HvdReplayConfig, PayoffConfig, SuffixCacheConfig
from avkit.hvd import PAPER
from avkit.hvd.cost import linear_table
from avkit.hvd.fit import fit_hvd_table
from avkit.hvd.markdown import COLS, hvd_markdown, table_md, verdict_md
from avkit.hvd.replay import greedy_traces, load_generations, replay, synthetic_generations
from avkit.hvd.suffix_cache import SuffixCache
from avkit.hvd.features import token_classes_for
from avkit.markdown import md_table
from avkit.scheduling.cost import CostTable
from avkit.trace.shards import resolve_shards
from common import RESULTS, header, write  # bench/ is on sys.path when run as a script
from hvd_live import live_main

COSTS = {"this pair (draft step = 0.33 target forward)": linear_table(HvdCostConfig(draft_step_cost=0.33)),
         "EAGLE-like drafter (draft step = 0.05 target forward)": linear_table(HvdCostConfig(draft_step_cost=0.05))}


def _inputs(args):
    if args.synthetic:
        return synthetic_generations(args.synthetic, seed=0), None, f"{args.synthetic} synthetic generations", {}
    paths = resolve_shards(args.traces) if args.traces else greedy_traces()  # as `avkit hvd` resolves TRACE
    gens, facts = load_generations(paths)
    classes = token_classes_for(paths)
    if classes.table is None:
        print(f"warning: {classes.source}", file=sys.stderr)
    facts = {"traces": [str(p) for p in paths], "unknown_model_positions": facts["unknown_model_positions"],
             "temperatures": sorted(facts["temperatures"])}
    return gens, classes.table, ", ".join(p.name for p in paths), facts


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


def suffix_cache(a) -> None:
    res = run(a.prompt, a.output, a.requests, a.max_depth, traced=False)
    mem = run(a.prompt, a.output, a.requests, a.max_depth, traced=True)
    res.update(mib=mem["mib"], bytes_per_node=mem["bytes_per_node"])  # tracemalloc: every allocation of the cache
    lines = [f"Prompt {a.prompt} tokens, output {a.output} tokens, {a.requests} cached responses, max_depth "
             f"{a.max_depth}; `mib` and `bytes_per_node` by tracemalloc (a second, traced pass).", "",
             md_table(("measure", "value"), [(k, f"{v:.2f}") for k, v in res.items()])]
    print("\n".join(lines))
    write({a.out or RESULTS / "suffix_cache.md": header("Suffix cache drafter: time per token and memory "
                                                         "(bench/hvd.py --suffix-cache)") + "\n".join(lines) + "\n"})


def main() -> None:
    if sys.argv[1:2] == ["live"]:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        sys.exit(live_main(sys.argv[2:]))  # bench/hvd_live.py
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="*")
    ap.add_argument("--synthetic", type=int, default=0)
    ap.add_argument("--out", default="", help="default bench/results/hvd.md (--suffix-cache: suffix_cache.md)")
    sc = ap.add_argument_group("--suffix-cache (bench/README.md)")
    sc.add_argument("--suffix-cache", action="store_true", help="time and size the suffix cache drafter instead")
    sc.add_argument("--prompt", type=int, default=2000)
    sc.add_argument("--output", type=int, default=500)
    sc.add_argument("--requests", type=int, default=50)
    sc.add_argument("--max-depth", type=int, default=SuffixCacheConfig.max_depth)
    ap.add_argument("--epochs", type=int, default=PayoffConfig.epochs)
    ap.add_argument("--cost-table", default="", help="this device's `avkit profile` table: the leading cost model")
    ap.add_argument("--save", default="", help="write the leading cost model's payoff files here")
    a = ap.parse_args()
    if a.suffix_cache:
        return suffix_cache(a)
    costs = dict(COSTS)
    if a.cost_table:
        costs = {f"measured on this device ({a.cost_table})": CostTable.load(a.cost_table).in_forwards(), **COSTS}
    gens, classes, source, facts = _inputs(a)
    rc = HvdReplayConfig()
    t0 = time.perf_counter()
    table = replay(gens, SuffixCacheConfig(), rc, classes, progress=True)
    replay_s = time.perf_counter() - t0
    results = {}
    for i, (name, cost) in enumerate(costs.items()):
        results[name] = fit_hvd_table(table, a.save or None if i == 0 else None, replay_config=rc,
                                      payoff_config=PayoffConfig(epochs=a.epochs), cost=cost,
                                      structure=classes is not None, ablation=i == 0,
                                      extra_info={"replay_s": round(replay_s, 2), **facts})
    first, *others = list(results)
    second = others[-1]
    notes = (f"Source: {source}. Generated by `python bench/hvd.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
             f" ({os.cpu_count()} CPU cores). Cost model below: {first}.")
    if facts.get("temperatures"):
        notes += (f" Recording temperature(s): {facts['temperatures']} (sampled continuations give unbiased "
                  "draws of a deterministic cache draft's accepted length; see `greedy_traces` in "
                  "`avkit/hvd/replay.py`).")
    if facts.get("unknown_model_positions"):
        unknown = ", ".join(f"{u:.1%}" for u in facts["unknown_model_positions"])
        notes += (" Model-drafter matches come from the trace's own draft tokens; positions no step labels "
                  f"(bonus tokens) are counted as hits: {unknown} of positions.")
    md = hvd_markdown(results[first], f"HVD replay: {source}", notes)
    for name in others:
        res = results[name]
        md += "\n".join(["", f"## Cost sensitivity: {name}", "",
                         table_md(res.metrics.filter(pl.col("dataset") == "overall"), COLS), "",
                         "Thresholds: " + ", ".join(f"{k} tau={v:.3f}" for k, v in res.thresholds.items())
                         + f"; model survival scale {res.info.get('model_scale')}", "",
                         *verdict_md(res.verdict)])
    md += "\n" + _discussion(results[first].metrics, results[second].metrics, results[first].budget, results[first].info) + "\n"
    write({a.out or RESULTS / "hvd.md": md})
    print(md)


def _discussion(m_pair: pl.DataFrame, m_eagle: pl.DataFrame, budget: pl.DataFrame, info: dict) -> str:
    def get(m, router, col, dataset="overall") -> float:
        row = m.filter((pl.col("router") == router) & (pl.col("dataset") == dataset))
        return float(row[col][0]) if row.height and row[col][0] is not None else float("nan")

    def pct(router, col, dataset="overall") -> str:
        x = get(m_pair, router, col, dataset)
        return "-" if math.isnan(x) else f"{x:.1%}"

    def pr(router, dataset="overall") -> str:  # precision / recall for payoff >= 6
        return f"{pct(router, 'precision', dataset)} / {pct(router, 'recall', dataset)}"

    def tp(c, router) -> float:
        row = budget.filter((pl.col("concurrency") == c) & (pl.col("router") == router))
        return row["throughput"][0] if row.height else float("nan")

    def speedup(m) -> str:
        return f"mlp {get(m, 'mlp', 'speedup_vs_model'):.3f}x, survival {get(m, 'survival', 'speedup_vs_model'):.3f}x"

    cycles = ", ".join(f"{name} {get(m_pair, r, 'cycles_per_1k'):.0f}" for name, r in (
        ("model-only", "model"), ("suffix-only", "suffix"), ("cache first", "cache"), ("mlp", "mlp"),
        ("survival", "survival")))
    return "\n".join([
        "## Where avkit stands", "", f"Reference: {PAPER}.",
        f"- payoff MLP, high-payoff (predicted >= 6 vs oracle >= 6) precision {pct('mlp', 'precision')} / recall "
        f"{pct('mlp', 'recall')}; survival head "
        f"{pr('survival')}.",
        f"- cycles per 1000 tokens: {cycles}.",
        f"- speedup over model-only: {speedup(m_pair)} (this pair); with an EAGLE-like drafter "
        f"{speedup(m_eagle)}.",
        (f"- the data: {info['rows_with_cache_draft'] / info['rows']:.0%} of positions have a cache draft "
         f"(mean length {info['mean_cache_draft_len']:.2f}); only {info['high_payoff_rate']:.1%} of them reach "
         f"an accepted length >= {info['high_payoff']}; the draft model accepts {info['mean_model_acc']:.2f} "
         f"tokens per position on average against the cache's {info['mean_cache_acc']:.2f}; "
         f"test split: {info['split_requests']['test']} requests."),
        *[f"- {d}: precision / recall for payoff >= 6: mlp {pr('mlp', d)}, survival {pr('survival', d)} "
          "(paper: 78-88% / 61-80%)." for d in sorted(set(m_pair["dataset"]) - {"overall"})],
        *[f"- concurrency {c}: survival+budget {tp(c, 'survival+budget'):.3f} vs mlp threshold {tp(c, 'mlp'):.3f} "
          f"vs model-only {tp(c, 'model'):.3f} tokens per target forward." for c in sorted(set(budget["concurrency"]))]])


if __name__ == "__main__":
    main()
