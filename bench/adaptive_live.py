"""Live adaptive verification on this machine: tokens/s of no-spec, fixed K and adaptive, side by side.

    python bench/adaptive_live.py                                   # real Qwen2.5-Coder pair (slow on CPU)
    python bench/adaptive_live.py --target qwen2.5-coder-0.5b --draft DIR_OF_A_SMALLER_MODEL
    python bench/adaptive_live.py --concurrency 1,4,16 --max-new-tokens 64 --requests-per-lane 2

NOT run by the test suite and not run while traces are being recorded (it needs the CPU to itself).
Steps: (1) profile this device's step costs with the same models (`avkit.scheduling.profile`, the
table the adaptive budget divides by; context = --context-len, default 1024: the workloads' real
contexts are short); (2) for each concurrency, run the same HumanEval prompts and seeds through the
engine under no-spec (k = 0), fixed K (engine k = K, full verification) for K in --ks, and adaptive
(engine k = max K, AdaptiveVerification with the online estimator, warm-started from
traces/coefficients.json when it exists, and its draft gate), --repeats times each, interleaved with
the order alternating; (3) print and write bench/results/adaptive_live.md with the mean tokens/s
and each policy's ratio to the best fixed K. Goal (issue 5): adaptive within 5% of the best
fixed K at each concurrency and ahead of every fixed K at the highest.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from avkit.config import DEFAULT_DRAFT, DEFAULT_TARGET, EngineConfig, ProfileConfig, SamplingConfig
from avkit.models import load
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.scheduling.adaptive import make_adaptive
from avkit.scheduling.cost import CostTable
from avkit.scheduling.profile import profile_costs
from avkit.workloads import load_workload


def prompts(tokenizer, n: int) -> list[list[int]]:
    out = []
    for p in load_workload("humaneval", n, seed=0):
        out.append(tokenizer.apply_chat_template(list(p.messages), add_generation_prompt=True) if p.messages
                   else tokenizer.encode(p.text))
    return out


def run(target, draft, k: int, policy, prompt_ids, concurrency: int, max_new: int,
        seed: int) -> tuple[float, int, int]:
    """(wall-clock tokens/s, tokens, engine steps) of one engine run over all prompts at `concurrency`."""
    cfg = EngineConfig(k=k, max_batch=concurrency, max_len=max(len(p) for p in prompt_ids) + max_new + k + 2,
                       seed=seed)
    engine = Engine(target, draft if k > 0 else None, cfg, policy=policy)
    sampling = SamplingConfig(temperature=0.8, top_p=0.95, max_new_tokens=max_new, seed=seed)
    reqs = [Request(f"r{i}", ids, sampling, "humaneval") for i, ids in enumerate(prompt_ids)]
    t0 = time.perf_counter()
    gens = engine.generate(reqs)
    seconds = time.perf_counter() - t0
    tokens = sum(len(g.output_ids) for g in gens)
    return tokens / seconds, tokens, engine.stats.steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--draft", default=DEFAULT_DRAFT)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--ks", default="1,3,5,7")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--requests-per-lane", type=int, default=2)
    ap.add_argument("--min-requests", type=int, default=8,
                    help="at least this many requests per run (low concurrency: less sampling noise)")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved runs of every policy (order alternates)")
    ap.add_argument("--context-len", type=int, default=1024)
    ap.add_argument("--cost", default="", help="reuse this profiled cost table instead of profiling again")
    ap.add_argument("--coefficients", default="traces/coefficients.json")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out", default="bench/results/adaptive_live.md")
    args = ap.parse_args(argv)
    conc = [int(c) for c in args.concurrency.split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    target, draft = load(args.target, dtype=dtype), load(args.draft, dtype=dtype)
    out = Path(args.out)
    if args.cost:
        cost = CostTable.load(args.cost)
        print(f"cost table: {args.cost} (reused)", flush=True)
    else:
        print(f"profiling step costs ({args.target} + {args.draft}, context {args.context_len}) ...", flush=True)
        cost = profile_costs(target, draft, ProfileConfig(context_len=args.context_len, k=max(ks),
                                                          max_tokens=max(conc) * (max(ks) + 1),
                                                          max_requests=max(conc), repeats=3))
        print(f"cost table: {cost.save(out.with_name(out.stem + '_cost.json'))}", flush=True)
    coef = args.coefficients if Path(args.coefficients).is_file() else ""
    title = (f"# Live adaptive verification ({target.model_id} + {draft.model_id}, {args.dtype}, CPU, "
             f"{torch.get_num_threads()} threads)\n")
    setup = (f"T=0.8, top-p 0.95, {args.max_new_tokens} new tokens, HumanEval prompts, "
             f"max({args.min_requests}, {args.requests_per_lane} x concurrency) requests per run; cost table "
             f"profiled at context {args.context_len} (forwards + the engine's logits work, "
             f"`avkit.scheduling.profile`{'; reused: ' + args.cost if args.cost else ''}); "
             f"estimator online_logistic{' warm-started from ' + coef if coef else ' (cold start)'}.\n")
    lines = [title, setup,
             f"Each policy ran {args.repeats} times per concurrency, interleaved: the policy order alternates "
             "forward and reverse between repeats, so a slow drift of this box weighs on every policy alike. "
             "tokens/s is the mean over repeats (each repeat's value in brackets); x best fixed divides means. "
             "Adaptive starts every run cold (its draft gate has seen nothing; the estimator is warm-started).\n",
             "Drafted / verified: mean per request-step; skipped: share of engine steps the adaptive draft gate "
             "ran target-only (no drafting).\n",
             "| concurrency | policy | tokens/s | x best fixed | drafted | verified | skipped |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    run(target, draft, max(ks), None, prompts(target.tokenizer, 1), 1, 8, 0)  # warm-up (allocations, caches)
    names = ["nospec", *(f"fixed{k}" for k in ks), "adaptive"]
    for c in conc:
        ids = prompts(target.tokenizer, max(args.min_requests, c * args.requests_per_lane))
        tps: dict[str, list[float]] = {name: [] for name in names}
        counts, gated = [], []  # adaptive: (drafted, verified) per drafted step; (drafts?, requests) per gate call
        for rep in range(args.repeats):
            for name in (names if rep % 2 == 0 else names[::-1]):
                if name == "adaptive":
                    policy = make_adaptive(cost=cost, estimator="online_logistic", coefficients=coef, k=max(ks))
                    decide, gate = policy.num_verify, policy.draft_this_step

                    def counted(batch, load, decide=decide, counts=counts):
                        out = decide(batch, load)
                        counts.append((int(batch.num_drafted.sum()), int(out.num_verify.sum())))  # out: a StepPlan
                        return out

                    def logged(load, gate=gate, gated=gated):
                        on = gate(load)
                        gated.append((on, load.num_requests))
                        return on

                    policy.num_verify, policy.draft_this_step = counted, logged
                    result = run(target, draft, max(ks), policy, ids, c, args.max_new_tokens, 0)
                else:
                    k = 0 if name == "nospec" else int(name.removeprefix("fixed"))
                    result = run(target, draft, k, None, ids, c, args.max_new_tokens, 0)
                tps[name].append(result[0])
                print(f"c={c} repeat {rep + 1}: {name} {result[0]:.2f} tok/s", flush=True)
        mean = {name: sum(v) / len(v) for name, v in tps.items()}
        best = max(v for name, v in mean.items() if name.startswith("fixed"))
        for name in names:
            k = 0 if name == "nospec" else int(name.removeprefix("fixed")) if name.startswith("fixed") else None
            if k is None:
                per = max(sum(n for _, n in gated), 1)  # request-steps the gate was asked about
                dv = (f"{sum(d for d, _ in counts) / per:.2f} | {sum(v for _, v in counts) / per:.2f} | "
                      f"{sum(not on for on, _ in gated) / max(len(gated), 1):.2f}")
            else:
                dv = f"{k} | {k} | 0"
            reps = ", ".join(f"{v:.2f}" for v in tps[name])
            lines.append(f"| {c} | {name} | {mean[name]:.2f} [{reps}] | {mean[name] / best:.3f} | {dv} |")
            print(lines[-1], flush=True)
        tmp = out.with_suffix(".tmp")  # after every concurrency: a long run that dies keeps what it measured
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
