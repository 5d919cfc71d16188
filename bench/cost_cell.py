"""A live cell's kept steps against the cost learner (`python bench/live.py cost --cell STEPS`; bench/live_cost.py
hands the flag to this file). STEPS: a cell's `<trace>.steps.jsonl` (bench/adaptive_live.py, every run's drafting
steps: policy, repeat, StepTime fields; its kept table and trace beside it, where present); --cost: the learner's
prior (the table the cell's adaptive runs started from). No models, seconds.

  held out   tables learned by today's CostLearner (probes off: the steps are replayed as timed) from the
             adaptive policy's steps of repeats 0-1 (one learner; and `carried`: one per repeat, as the cell's
             runs carry their model), and from every policy's steps of repeats 0-1, beside the prior and the
             cell's kept table (its last adaptive run's, <trace>.learned_cost.json), each scored on repeat
             2's steps of every policy: mean predicted / mean measured step ms, the engine's pricing (`step_cost`
             of its shape and context)
  drift      each policy's mean step ms per repeat: what no table learned from other repeats can know
  depth      the adaptive policy in `avkit simulate` of the kept trace priced with each table: tokens per
             request-step (the early-stop depth follows the table it prices with)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from avkit.scheduling.cost import CostTable
from avkit.scheduling.learn import CostLearner
from avkit.step_types import StepTime


def _step(d: dict) -> StepTime:
    return StepTime(d["num_requests"], d["passes"], d["tokens"], d["context_tokens"], d["ms"], d["draft_rows"],
                    d["lookups"], tuple(d["catch_up"]), d["drafting_ms"])


def learn(prior: CostTable, steps: list[dict]) -> CostTable:
    learner = CostLearner(prior, probe_every=0)
    for d in steps:
        learner.observe(_step(d))
    return learner.refit()


def read_steps(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def carried(prior: CostTable, steps: list[dict], repeats=None) -> CostTable:
    """The model a cell's adaptive runs carry, replayed: one learner per repeat (None: each the steps hold), from
    the model the previous one left (the first from `prior`), fed that repeat's adaptive steps (a repeat's
    adaptive runs as one; the cell's warm-up run and its steps without drafts, a depth-0 probe's, are not kept)."""
    for r in sorted({d["repeat"] for d in steps}) if repeats is None else repeats:
        prior = learn(prior, [d for d in steps if d["repeat"] == r and not d["policy"].startswith("fixed")])
    return prior


def cell_lines(steps_path: str, prior: CostTable, coefficients: str = "") -> list[str]:
    """The module note's three tables for one cell, as Markdown lines."""
    from avkit.sim.replay import simulate  # the simulator, only here

    path = Path(steps_path)
    rows = read_steps(path)
    trace = path.with_name(path.name.removesuffix(".steps.jsonl") + ".parquet")
    concurrency = int(trace.stem.rsplit("_c", 1)[-1])  # <dataset>_T<T>_c<c>
    kept = trace.with_suffix(".learned_cost.json")
    adaptive = [d for d in rows if not d["policy"].startswith("fixed")]
    tables = {"prior": prior, **({"kept": CostTable.load(kept)} if kept.is_file() else {}),
              "adaptive r0-1": learn(prior, [d for d in adaptive if d["repeat"] < 2]),
              "carried r0-1": carried(prior, rows, (0, 1)),
              "all r0-1": learn(prior, [d for d in rows if d["repeat"] < 2])}
    policies = list(dict.fromkeys(d["policy"] for d in rows))
    by = {(p, r): [d for d in rows if d["policy"] == p and d["repeat"] == r and not d["catch_up"]]
          for p in policies for r in range(3)}
    price = lambda m, d: float(m.step_cost(d["num_requests"], d["passes"], d["tokens"], d["context_tokens"],
                                           d["draft_rows"], d["lookups"]))
    out = [f"### `{path}` (prior `{prior.meta.get('path', '')}`)", "",
           "Held out: repeat 2's steps, mean predicted / mean measured step ms, per table (module note).", "",
           "| policy | steps | measured ms | " + " | ".join(tables) + " |", "|---|---:|---:|" + "---:|" * len(tables)]
    for p in policies:
        held = by[p, 2]
        ms = np.mean([d["ms"] for d in held])
        out.append(f"| {p} | {len(held)} | {ms:.0f} | " +
                   " | ".join(f"{np.mean([price(m, d) for d in held]) / ms:.3f}" for m in tables.values()) + " |")
    out += ["", "Drift: mean step ms by repeat (max / min - 1: the spread no other repeat's table can know).", "",
            "| policy | repeat 0 | repeat 1 | repeat 2 | spread |", "|---|---:|---:|---:|---:|"]
    for p in policies:
        means = [np.mean([d["ms"] for d in by[p, r]]) for r in range(3)]
        out.append(f"| {p} | " + " | ".join(f"{m:.0f}" for m in means) + f" | {max(means) / min(means) - 1:.3f} |")
    if not (adaptive and trace.is_file()):
        return out + [""]
    live = [np.mean([d["passes"] for d in by[adaptive[0]["policy"], r]]) for r in range(3)]
    out += ["", f"Depth: the adaptive policy simulated on the kept trace (c = {concurrency}) with each table; "
            "live draft passes per drafting step by repeat: " + ", ".join(f"{x:.2f}" for x in live) + ".", "",
            "| table | drafts / request-step | tokens / request-step | step ms |", "|---|---:|---:|---:|"]
    for name, m in tables.items():
        df = simulate([str(trace)], m, [concurrency], [adaptive[0]["policy"]], coefficients=coefficients)
        out.append(f"| {name} | {df['drafted_per_step'][0]:.2f} | {df['tokens_per_step'][0]:.2f} | "
                   f"{df['step_ms'][0]:.0f} |")
    return out + [""]
