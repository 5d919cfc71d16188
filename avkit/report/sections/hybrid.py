"""Hybrid drafting (HVD): precision / recall of high-payoff cache drafts, decoding cycles per 1,000
tokens and speedups per router, from `avkit hvd` (hvd_metrics.json, held-out requests)."""

from __future__ import annotations

import math

from avkit.hvd import METRICS, PAPER, SPEEDUPS
from avkit.hvd.markdown import cost_md
from avkit.report import plots
from avkit.report.document import Figure, Section, Table, fmt, grid_table, record_table
from avkit.report.inputs import ReportInputs

VERDICT = (("dataset", "dataset", None), ("best single", "best_single_router", None),
           ("tokens/forward", "best_single", 3), ("best HVD", "best_router", None), ("tokens/forward", "best_hvd", 3),
           ("ratio", "ratio", 3), ("fewer cycles", "fewer_cycles", 3),
           (">= 0.99x", lambda r: "yes" if r["holds"] else "NO", None), ("oracle headroom", "headroom", 3))


def _table(rows: list[dict], caption: str, collapsed: bool = False, with_dataset: bool = False) -> Table:
    lead = ("router", "dataset") if with_dataset else ("router",)
    cols = [(c, c, None) for c in lead] + [(c, c, 1 if c == "cycles_per_1k" else 3) for c in METRICS + SPEEDUPS]
    return record_table(rows, cols, caption=caption, collapsed=collapsed,
                        numeric=(False,) * len(lead) + (True,) * (len(cols) - len(lead)))


def _budget_table(budget: list[dict]) -> Table | None:
    if not budget or "concurrency" not in budget[0]:
        return None
    return grid_table({(r["concurrency"], r["router"]): r["throughput"] for r in budget}, "concurrency",
                      sorted({r["concurrency"] for r in budget}), list(dict.fromkeys(r["router"] for r in budget)), 3,
                      caption="Batched replay: tokens per target forward; survival+budget lets cache and model "
                              "slots compete for one adaptive verification budget.")


def _verdict_table(verdict: list[dict]) -> Table | None:
    """Per dataset: the best HVD router against the better single drafter (avkit/hvd/verdict.py)."""
    return record_table(verdict, VERDICT, caption=(
        "Goal: the best HVD router at >= 0.99x the best single drafter on every dataset (test requests decoded one "
        "at a time, one cost accounting). Oracle headroom: a clairvoyant router's throughput over the best single "
        "drafter, the most any router could reach with these drafts (avkit/hvd/verdict.py).")) if verdict else None


def build(inputs: ReportInputs) -> Section:
    sec, blob = Section("hybrid", "Hybrid drafting (cache + model)"), inputs.hvd
    if blob is None:
        return sec.omit(inputs.notes.get("hvd", "no HVD results"))
    rows = blob["metrics"]
    overall = [r for r in rows if r["dataset"] == "overall"]
    info = blob.get("info", {})
    sec.add(f"Replay of {fmt(info.get('requests'))} recorded generations ({fmt(info.get('rows'))} decode "
            f"positions, K = {info.get('k', '?')}); routers fitted on train requests, thresholds on validation, "
            f"scored on held-out test requests. High payoff = accepted length ≥ {info.get('high_payoff', 6)}. "
            + f"Reference: {PAPER}.")
    if info.get("cost"):
        sec.add(cost_md(info["cost"]))  # as `avkit hvd --markdown` states it: linear, or the measured curves
    sec.add(_table(overall, "Routers over all test requests. Speedups are throughput ratios under the HVD cost "
                            "model (target-only decoding = 1)."))
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    for name, col, caption, title, ylabel, baseline, alt in (
            ("hvd_speedup", "speedup_vs_model", "Speedup of each router over model-only drafting, per dataset.",
             "Speedup over model-only drafting", "throughput ratio (×)", 1.0, "HVD speedup per router"),
            ("hvd_cycles", "cycles_per_1k", "Target verifications per 1,000 generated tokens (lower is better).",
             "Decoding cycles per 1,000 tokens", "cycles / 1,000 tokens", None, "HVD cycles per 1000 tokens")):
        values = {d: {r["router"]: math.nan if r[col] is None else r[col] for r in rows if r["dataset"] == d}
                  for d in datasets}
        sec.add(Figure(name, caption, plots.grouped_bars(values, title, ylabel, baseline), alt=alt))
    sec.add(_table([r for r in rows if r["dataset"] != "overall"], "Per dataset.", collapsed=True, with_dataset=True),
            _verdict_table(blob.get("verdict", [])), _budget_table(blob.get("budget", [])))
    tau = blob.get("thresholds", {})
    if tau:
        sec.add("Thresholds τ: " + ", ".join(f"{k} {v:.3f}" for k, v in tau.items() if not math.isnan(v)) + ".")
    return sec
