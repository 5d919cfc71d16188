"""Predicted / live step time, offline profile vs the cost model learned online (scheduling/learn.py).

    python bench/cost_live.py --cost bench/results/avkit_cost_cpu.json     # the real pair: an IDLE machine
    python bench/cost_live.py --tiny                                       # smoke run on tiny random models

Cells: temperature T x batch b x K (fixed K verifies every draft; K = 0 decodes target-only). Each cell runs
b requests of the workload through the engine and times every decode step (the engine's own StepTime). One
learner per temperature carries over from cell to cell, as a server's does. Per cell: the median of actual /
predicted over the steps after `--warmup`, predicted by the profiled table (offline) and by the learned model
as it stood before the step (online). The goal: online within +-10% in every cell. Timings are only
meaningful on an otherwise idle machine; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from avkit.config import DEFAULT_COST_PATH, DEFAULT_DRAFT, DEFAULT_TARGET, SamplingConfig
from avkit.models import load
from avkit.runtime.engine import Engine, EngineConfig
from avkit.runtime.request import Request
from avkit.scheduling.cost import CostTable, resolve_cost
from avkit.scheduling.learn import CostLearner
from avkit.scheduling.policy import FixedK
from avkit.workloads import load_workload
from common import RESULTS, header, write  # bench/common.py


class TimedFixedK(FixedK):
    """Fixed K that feeds every step's time to a learner and keeps (offline, online) actual / predicted."""

    def __init__(self, k: int, learner: CostLearner):
        super().__init__(k)
        self.learner, self.ratios = learner, []

    def observe_step_time(self, timing):
        offline = timing.ms / float(self.learner.prior.step_cost(timing.num_requests, timing.passes, timing.tokens,
                                                                 timing.context_tokens, timing.draft_rows,
                                                                 timing.lookups))
        online = self.learner.observe(timing)
        if not timing.catch_up:
            self.ratios.append((offline, online))
        return online


def _cell(target, draft, prompts, t: float, b: int, k: int, steps: int, learner: CostLearner) -> TimedFixedK:
    policy = TimedFixedK(k, learner)
    engine = Engine(target, draft if k else None, EngineConfig(k=k, concurrency=b, max_len=2048), policy=policy)
    sampling = SamplingConfig(temperature=t, max_new_tokens=steps)
    engine.generate([Request(f"r{i}", prompts[i % len(prompts)], sampling) for i in range(b)])
    return policy


def _tiny(root: Path):
    from avkit.models.testing import write_tiny_model

    target = load(write_tiny_model(root / "t", vocab=300, seed=0, hidden=64, layers=2))
    draft = load(write_tiny_model(root / "d", vocab=300, seed=1, hidden=32, layers=1, heads=2, kv_heads=1))
    cost = CostTable((1, 8, 64), (1.0, 1.5, 4.0), (1, 8), (0.3, 0.5), meta={"source": "smoke"})
    return target, draft, [[5 + i, 17, 33, 9, 4, 8] for i in range(16)], cost


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--draft", default=DEFAULT_DRAFT)
    ap.add_argument("--cost", default=DEFAULT_COST_PATH, help="the profiled table (`avkit profile`) to compare")
    ap.add_argument("--dataset", default="humaneval")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--ks", default="0,3,5,7")
    ap.add_argument("--steps", type=int, default=64, help="new tokens per request (steps of a cell)")
    ap.add_argument("--warmup", type=int, default=8, help="steps of each cell left out of its medians")
    ap.add_argument("--out", default="", help="Markdown (default bench/results/cost_live.md; --tiny: a temp file)")
    ap.add_argument("--tiny", action="store_true", help="tiny random models and a made-up table (a smoke run)")
    a = ap.parse_args(argv)
    ints = lambda s: [int(x) for x in s.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        if a.tiny:
            target, draft, prompts, cost = _tiny(Path(tmp))
        else:
            target, draft = load(a.target, dtype=torch.bfloat16), load(a.draft, dtype=torch.bfloat16)
            cost = resolve_cost(a.cost)
            tok = target.tokenizer  # raw text, or a chat's first turn through the chat template (as `avkit record`)
            prompts = [tok.encode(p.text) if not p.messages else
                       tok.apply_chat_template(list(p.messages[:1]), add_generation_prompt=True)
                       for p in load_workload(a.dataset, n=64)]
        rows = []
        for t in (float(x) for x in a.temperatures.split(",")):
            learner = CostLearner(cost, probe_every=0)  # fixed K: every shape it runs is visited anyway
            for b in ints(a.batches):
                for k in ints(a.ks):
                    ratios = _cell(target, draft, prompts, t, b, k, a.steps, learner).ratios[a.warmup:]
                    off, on = (statistics.median(r[i] for r in ratios) if ratios else float("nan") for i in (0, 1))
                    rows.append((t, b, k, len(ratios), off, on))
                    print(f"T={t:g} b={b} K={k}: offline {off:.3f}, online {on:.3f} ({len(ratios)} steps)",
                          file=sys.stderr)
    lines = [header("Predicted / live step time: the profiled table vs the cost model learned online") +
             f"Cost `{a.cost if not a.tiny else 'smoke'}`; median of actual / predicted over each cell's steps "
             f"after {a.warmup}. Goal: online within 0.90-1.10 in every cell.", "",
             "| T | batch | K | steps | offline | online |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {t:g} | {b} | {k} | {n} | {off:.3f} | {on:.3f} |" for t, b, k, n, off, on in rows]
    out = a.out or (Path(tempfile.gettempdir()) / "cost_live_tiny.md" if a.tiny else RESULTS / "cost_live.md")
    write({out: "\n".join(lines) + "\n"})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
