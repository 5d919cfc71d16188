"""Predicted / live step time, offline profile vs the cost model learned online (scheduling/learn.py).
Run as `python bench/live.py cost ...` (bench/live.py hands its `cost` mode to this file; usage: bench/README.md).

Cells: T x batch b x K (bench/README.md): each times every decode step of b requests (each decodes
max(--min-tokens, (--min-steps + 16) (K + 1)) new tokens, no end-of-text stop); one learner per temperature
carries over from cell to cell. Per cell: the median of actual / predicted over its measured steps (steps whose
shape, learn.py's key, the learner had already learned from; catch-up steps left out), by the offline table and
by the learned model as it stood before the step; a cell short of --min-steps measured steps is marked. Goal:
online within +-10% in every cell (an idle machine). `--cost profile` profiles this CPU first (`avkit profile`'s
step timing, one table per temperature, saved beside the results).

Step log (JSON lines beside the Markdown: `<out stem>_steps.jsonl`, e.g. bench/results/cost_live_steps.jsonl):
  {"T": t, "table": {...}}   first, one per temperature: the offline table (the learner's prior), cost-file JSON
  then one line per decode step, in the order the learner saw them:
  T, batch, K       the cell
  i               the step's index in its cell
  n, passes, tokens, context, rows, lookups, catch_up   its StepTime (requests, draft passes, target tokens,
                  cached context tokens, draft rows (null: all), cache lookups, [lags] of its catch-ups;
                  lookups 0 and catch_up [] are left out)
  ms              its wall time (ms, rounded to 0.1 us; the learner saw the rounded value)
  drafting_ms     its drafting phase's wall time, where the engine timed it apart (CPU; rounded the same)
  offline_ms      the offline table's price of it (its step, no catch-ups)
  online_ms       the learned model's price of it as the model stood before the step
  learned         whether its shape was learned before it (a measured step)
`--replay LOG` feeds the logged steps, temperature by temperature in their order, through the current
CostLearner (the logged table its prior) and prints the table the live run would have printed with this
learner: no models, seconds for the whole grid. With an unchanged learner it equals the live table.
`--replay LOG --visit 7` feeds it only the batch-1 steps of those depths, as an adaptive policy at c1
runs, with probes on the learner's schedule, and scores its price of the other depths (`visit`).
`--traces A,B --score C,D` (recorded traces, e.g. `avkit record --learn-cost` runs) feeds each of A, B in order to
a learner from the table the previous one left (the first from --cost), as runs carrying their learned model do,
and scores C and D per draft depth: mean predicted / mean measured over their decode steps (`traces`).
`--cell A.steps.jsonl,B.steps.jsonl` (live cells' kept steps, bench/adaptive_live.py): held-out scores, drift by
repeat and the simulated adaptive depth per table, --cost the prior (bench/cost_cell.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import avkit.models
import torch
from avkit.config import DEFAULT_COST_PATH, DEFAULT_DRAFT, DEFAULT_TARGET, EngineConfig, SamplingConfig
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.scheduling.cost import CostTable, resolve_cost
from avkit.scheduling.learn import CostLearner
from avkit.scheduling.policy import FixedK
from avkit.sim.steps import trace_steps
from avkit.step_types import StepTime
from avkit.workloads import load_workload
from common import RESULTS, csv, header, load, options, profile_here, tiny_pair, write

FIELDS = ("n", "passes", "tokens", "context", "rows", "lookups", "catch_up", "ms")  # a logged StepTime, in order


def price(learner: CostLearner, offline: CostTable, t: StepTime) -> dict:
    """One step through the learner -> its log row's step fields (module note), the learner updated."""
    learned = learner.learned(t) > 0 and not t.catch_up
    online = learner.predict(t)
    learner.observe(t)
    offline_ms = float(offline.step_cost(t.num_requests, t.passes, t.tokens, t.context_tokens, t.draft_rows,
                                         t.lookups))
    return {**dict(zip(FIELDS, (t.num_requests, t.passes, t.tokens, t.context_tokens, t.draft_rows, t.lookups,
                                list(t.catch_up), t.ms))),
            **({} if t.drafting_ms is None else {"drafting_ms": t.drafting_ms}),
            "offline_ms": offline_ms, "online_ms": online, "learned": learned}


class TimedFixedK(FixedK):
    """Fixed K that prices every step through the learner (`price`) and keeps its log rows."""

    def __init__(self, k: int, learner: CostLearner, offline: CostTable, cell: dict):
        super().__init__(k)
        self.learner, self.offline, self.cell, self.rows = learner, offline, cell, []

    def observe_step_time(self, timing):
        timing = replace(timing, ms=round(timing.ms, 4), drafting_ms=None if timing.drafting_ms is None else
                         round(timing.drafting_ms, 4))  # the logged values (module note)
        self.rows.append({**self.cell, "i": len(self.rows), **price(self.learner, self.offline, timing)})
        return timing.ms / self.rows[-1]["online_ms"]


def _cell(target, draft, prompts, t: float, b: int, k: int, tokens: int, learner, offline) -> list[dict]:
    policy = TimedFixedK(k, learner, offline, {"T": t, "batch": b, "K": k})
    engine = Engine(target, draft if k else None, EngineConfig(k=k, concurrency=b, max_len=4096), policy=policy)
    engine.eos = frozenset()  # every request decodes all its tokens (as `avkit profile`'s steps)
    sampling = SamplingConfig(temperature=t, max_new_tokens=tokens)
    engine.generate([Request(f"r{i}", prompts[i % len(prompts)], sampling) for i in range(b)])
    return policy.rows


def cells(rows: list[dict]) -> list[tuple]:
    """Step rows -> per cell (T, batch, K, steps, measured, offline median, online median) (module note)."""
    by = {}
    for r in rows:
        by.setdefault((r["T"], r["batch"], r["K"]), []).append(r)
    out = []
    for (t, b, k), steps in by.items():
        seen = [r for r in steps if r["learned"]]
        off, on = (statistics.median(r["ms"] / r[col] for r in seen) if seen else float("nan")
                   for col in ("offline_ms", "online_ms"))
        out.append((t, b, k, len(steps), len(seen), off, on))
    return out


def _step(d: dict) -> StepTime:
    return StepTime(d["n"], d["passes"], d["tokens"], d["context"], d["ms"], d["rows"], d.get("lookups", 0),
                    tuple(d.get("catch_up", ())), d.get("drafting_ms"))


def read_log(log: Path) -> tuple[dict, list[dict]]:
    """A step log -> ({T: its offline table}, its step lines)."""
    try:
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        tables = {d["T"]: CostTable.from_json(d["table"], str(log)) for d in lines if "table" in d}
        steps = [d for d in lines if "table" not in d]
        [_step(d) for d in steps]  # every step line is a StepTime, else the error below
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"avkit: error: --replay {log}: not a step log of `live.py cost` ({e!r})", file=sys.stderr)
        raise SystemExit(2) from None
    return tables, steps


def replay(log: Path) -> tuple[list[dict], dict]:
    """The logged steps through today's CostLearner -> (new step rows, {T: its learner at the end})."""
    tables, steps = read_log(log)
    learners = {t: CostLearner(table, probe_every=0) for t, table in tables.items()}
    return [{**{c: d[c] for c in ("T", "batch", "K", "i")}, **price(learners[d["T"]], tables[d["T"]], _step(d))}
            for d in steps], learners


def visit(tables: dict, steps: list[dict], depths: set, total: int, every: int, k: int = 7) -> tuple[list, list]:
    """An adaptive policy at batch 1 replayed from the log: its learner (the logged table its prior, probes
    every `every` steps) sees `total` steps, cycling in log order through the batch-1 steps of `depths` (draft
    passes); a probe of a depth the log has takes that depth's next step. -> per T and depth (T, depth, steps,
    visited, offline, learned), each the median predicted / measured over the depth's steps the learner never
    saw, and per T (T, the probes' share of the replayed time, learned / prior draft pass at 1 row, KV slope)."""
    rows, probes = [], []
    for t, table in tables.items():
        own = [d for d in steps if d["T"] == t and d["batch"] == 1 and not d.get("catch_up")]
        by = {p: [d for d in own if d["passes"] == p] for p in sorted({d["passes"] for d in own})}
        queues = {p: itertools.cycle(ds) for p, ds in by.items()}
        stream = itertools.cycle([d for d in own if d["passes"] in depths])
        learner, seen, ms = CostLearner(table, probe_every=every), set(), [0.0, 0.0]  # [probe ms, all ms]
        for _ in range(total):
            depth = learner.probe_depth(k)
            probe = depth in queues and depth not in depths
            d = next(queues[depth] if probe else stream)
            ms[0] += d["ms"] * probe
            ms[1] += d["ms"]
            seen.add(id(d))
            learner.observe(_step(d))
        model = learner.refit()
        for p, ds in by.items():
            held = [d for d in ds if id(d) not in seen]
            ratio = lambda m, held=held: statistics.median(float(m.step_cost(*(d[f] for f in FIELDS[:5]))) / d["ms"]
                                                           for d in held)
            if len(held) >= 8:
                rows.append((t, p, len(held), p in depths, ratio(table), ratio(model)))
        probes.append((t, ms[0] / ms[1], model.draft_ms[0] / table.draft_ms[0], model.kv_ms_per_token))
    return rows, probes


def traces(prior: CostTable, learn: list[str], score: list[str]) -> list[tuple]:
    """`learn` fed run by run (module note), then per scored trace and depth (trace, depth, steps, prior, learned):
    mean predicted / mean measured step time over its decode steps."""
    table = prior
    for path in learn:
        learner = CostLearner(table)
        for t in trace_steps(path):
            learner.observe(t)
        table = learner.refit()
    rows = []
    for path in score:
        by = {}
        for t in trace_steps(path):
            by.setdefault(t.passes, []).append(t)
        for p, ts in sorted(by.items()):
            ratio = lambda m, p=p, ts=ts: sum(float(m.step_cost(t.num_requests, p, t.tokens, t.context_tokens))
                                              for t in ts) / sum(t.ms for t in ts)
            rows.append((path, p, len(ts), ratio(prior), ratio(table)))
    return rows


def save_learned(learners: dict, folder: str) -> None:
    """Each temperature's learned model as <folder>/cost_learned_T<T>.json (a cost file: --cost of the simulator,
    tune and the policy)."""
    for t, learner in learners.items():
        path = Path(folder) / f"cost_learned_T{t:g}.json"
        print(f"learned cost model (T = {t:g}): {learner.model.save(path)}", file=sys.stderr)


def _t(steps: str) -> str:
    """A cell's temperature from its kept file's name (<dataset>_T<T>_c<c>.steps.jsonl)."""
    return Path(steps).name.split("_T")[-1].split("_c")[0]


def _tiny():
    target, draft = (avkit.models.load(d) for d in tiny_pair("avkit-bench-"))
    cost = CostTable((1, 8, 64), (1.0, 1.5, 4.0), (1, 8), (0.3, 0.5), meta={"source": "smoke"})
    return target, draft, [[5 + i, 17, 33, 9, 4, 8] for i in range(16)], cost


def _lines(table: list[tuple], min_steps: int, intro: str) -> list[str]:
    inside = sum(0.9 <= r[-1] <= 1.1 for r in table)
    return [intro + f" Goal: online within 0.90-1.10 in every cell; here {inside} of {len(table)}.", "",
            "| T | batch | K | steps | measured | offline | online |", "|---:|---:|---:|---:|---:|---:|---:|",
            *(f"| {t:g} | {b} | {k} | {s} | {m}{'' if m >= min_steps else ' (few)'} | {off:.3f} | {on:.3f} |"
              for t, b, k, s, m, off, on in table)]


def cost_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="live.py cost", description="predicted / live step time (module note)")
    options(ap, target=DEFAULT_TARGET, draft=DEFAULT_DRAFT, temperatures="0,1", ks="0,3,5,7", tiny=False)
    ap.add_argument("--cost", default=DEFAULT_COST_PATH,
                    help="the offline table: a cost file, or `profile` (profile this CPU first, per temperature)")
    ap.add_argument("--dataset", default="humaneval")
    ap.add_argument("--batches", default="1,4,16", type=csv(int))
    ap.add_argument("--min-tokens", type=int, default=256, help="new tokens per request at least")
    ap.add_argument("--min-steps", type=int, default=32, help="measured steps a cell aims for (module note)")
    ap.add_argument("--out", default="", help="Markdown (default bench/results/cost_live.md; --tiny: a temp file); "
                                              "the step log beside it (module note)")
    ap.add_argument("--replay", default="", metavar="LOG", help="a step log: its steps through today's learner")
    ap.add_argument("--learned", default="", metavar="DIR",
                    help="write each temperature's learned model at the end to DIR/cost_learned_T<T>.json")
    ap.add_argument("--visit", default=None, type=csv(int), metavar="DEPTHS",
                    help="with --replay: feed the learner only batch-1 steps of these draft depths (`visit`)")
    ap.add_argument("--visit-steps", type=int, default=300, help="with --visit: steps the learner sees")
    ap.add_argument("--probe-every", type=int, default=CostLearner.probe_every,
                    help="with --visit: the learner's probe period (default: the learner's)")
    ap.add_argument("--traces", default=None, type=csv(), metavar="RUNS", help="recorded runs to learn from (`traces`)")
    ap.add_argument("--score", default=None, type=csv(), metavar="RUNS", help="with --traces: the traces to price")
    ap.add_argument("--cell", default=None, type=csv(), metavar="STEPS", help="live cells' steps (bench/cost_cell.py)")
    ap.add_argument("--coefficients", default="", help="with --cell: the adaptive policy's warm start, as the cell's")
    a = ap.parse_args(argv)
    if a.cell:
        from cost_cell import cell_lines
        lines = [header("Live cells' steps against the cost learner") + "bench/cost_cell.py (module note).", "",
                 *(x for s in a.cell for x in cell_lines(s, resolve_cost(a.cost.replace("{T}", _t(s))),
                                                         a.coefficients))]
        write({a.out: "\n".join(lines) + "\n"} if a.out else {})
        print("\n".join(lines))
        return 0
    if a.traces:
        lines = [header("Recorded runs priced by the cost model learned from others") +
                 f"Learned from {', '.join(f'`{p}`' for p in a.traces)} in order (bench/live_cost.py `traces`), "
                 f"prior `{a.cost}`; predicted / measured: mean over each depth's decode steps.", "",
                 "| trace | depth | steps | prior | learned |", "|---|---:|---:|---:|---:|",
                 *(f"| `{p}` | {d} | {n} | {off:.3f} | {on:.3f} |"
                   for p, d, n, off, on in traces(resolve_cost(a.cost), a.traces, a.score or a.traces))]
        write({a.out: "\n".join(lines) + "\n"} if a.out else {})
        print("\n".join(lines))
        return 0
    if a.replay and a.visit:
        rows, probes = visit(*read_log(Path(a.replay)), set(a.visit), a.visit_steps, a.probe_every)
        lines = [header("Depths an adaptive policy does not visit at batch 1: priced by the learner") +
                 f"Replay of `{a.replay}` (bench/live_cost.py `visit`): a learner fed {a.visit_steps} batch-1 steps "
                 f"of depths {a.visit} (*), a probe every {a.probe_every} steps; predicted / measured step time, the "
                 "median over each depth's steps it never saw. Per T: the probes' share of the replayed time, the "
                 "learned / prior draft pass at 1 row, the learned KV slope (ms per token): " +
                 "; ".join(f"T = {t:g} {share:.3f}, {draft:.3f}, {kv:.3f}" for t, share, draft, kv in probes) + ".",
                 "", "| T | depth | held-out steps | offline | learned |", "|---:|---:|---:|---:|---:|",
                 *(f"| {t:g} | {p}{'*' if v else ''} | {n} | {off:.3f} | {on:.3f} |" for t, p, n, v, off, on in rows)]
        write({a.out: "\n".join(lines) + "\n"} if a.out else {})
        print("\n".join(lines))
        return 0
    if a.replay:
        rows, learners = replay(Path(a.replay))
        if a.learned:
            save_learned(learners, a.learned)
        lines = _lines(cells(rows), a.min_steps, f"Replay of `{a.replay}` through the current cost learner (no "
                                                 "models; offline and learned prices recomputed).")
        if a.out:
            write({a.out: "\n".join(lines) + "\n"})
        print("\n".join(lines))
        return 0
    ks, batches = a.ks, a.batches
    tokens = {k: max(a.min_tokens, (a.min_steps + 16) * (k + 1)) for k in ks}
    if a.tiny:
        target, draft, prompts, cost = _tiny()
        cost = None if a.cost == "profile" else cost
    else:
        target, draft = (avkit.models.load(m, dtype=torch.bfloat16) for m in (a.target, a.draft))
        cost = None if a.cost == "profile" else resolve_cost(a.cost)
        tok = target.tokenizer  # raw text, or a chat's first turn through the chat template (as `avkit record`)
        prompts = [tok.encode(p.text) if not p.messages else
                   tok.apply_chat_template(list(p.messages[:1]), add_generation_prompt=True)
                   for p in load_workload(a.dataset, n=64)]
    rows, log, load_at_start, learners = [], [], load(), {}
    for t in a.temperatures:
        table = cost or profile_here(target, draft, prompts[:max(batches)], max(tokens.values()), max(ks), max(batches),
                                     t, 3, Path(tempfile.gettempdir() if a.tiny else RESULTS) / f"cost_live_T{t:g}.json")
        log.append({"T": t, "table": table.to_json()})
        learner = CostLearner(table, probe_every=0)  # fixed K: every shape it runs is visited anyway
        learners[t] = learner
        for b in batches:
            for k in ks:
                rows += _cell(target, draft, prompts, t, b, k, tokens[k], learner, table)
                *_, s, m, off, on = cells(rows)[-1]
                print(f"T={t:g} b={b} K={k}: offline {off:.3f}, online {on:.3f} ({m} of {s} steps)", file=sys.stderr)
    source = "this CPU, profiled first" if a.cost == "profile" else "smoke" if a.tiny else a.cost
    lines = _lines(cells(rows), a.min_steps, header(
        "Predicted / live step time: the profiled table vs the cost model learned online") +
        f"Offline table: {source}; load {load_at_start:.1f} when the cells began, {load():.1f} at the end. "
        f"Each request decodes max({a.min_tokens}, ({a.min_steps} + 16)(K + 1)) new tokens; per cell the "
        "median of actual / predicted over its measured steps: those whose "
        "shape (requests, passes, tokens, context band) the learner had already learned from (after the "
        "shape's warm-up and first refit), catch-up steps left out. Per-step log: the `_steps.jsonl` beside it.")
    out = Path(a.out) if a.out else Path(tempfile.gettempdir()) / "cost_live_tiny.md" if a.tiny else \
        RESULTS / "cost_live.md"
    rounded = lambda r: {k: round(v, 4) if k.endswith("_ms") else v for k, v in r.items()
                         if (k, v) not in (("lookups", 0), ("catch_up", []))}  # the defaults left out
    write({out: "\n".join(lines) + "\n",
           out.with_name(out.stem + "_steps.jsonl"): "".join(json.dumps(rounded(r)) + "\n" for r in log + rows)})
    if a.learned:
        save_learned(learners, a.learned)
    print("\n".join(lines))
    return 0
