"""Hybrid drafting (HVD): precision / recall of high-payoff cache drafts, decoding cycles per 1,000
tokens and speedups per router, from `avkit hvd` (hvd_metrics.json, held-out requests). The tables and the
text are `avkit hvd --markdown`'s (avkit/hvd/markdown.py)."""

from __future__ import annotations

import math

from avkit.hvd import PAPER
from avkit.hvd.markdown import COLS, VERDICT_COLS, budget_records, cells, cost_md, facts_md, thresholds_md
from avkit.report import plots
from avkit.report.document import Figure, Section, Table
from avkit.report.inputs import ReportInputs


def _table(records: list[dict], cols: tuple[str, ...] | None, caption: str, collapsed: bool = False) -> Table | None:
    """The HVD renderer's cells; text columns left-aligned."""
    if not records:
        return None
    columns, rows, numeric = cells(records, cols)
    return Table(columns, [tuple(r) for r in rows], caption=caption, collapsed=collapsed, numeric=tuple(numeric))


def build(inputs: ReportInputs) -> Section:
    sec, blob = Section("hybrid", "Hybrid drafting (cache + model)"), inputs.hvd
    if blob is None:
        return sec.omit(inputs.notes.get("hvd", "no HVD results"))
    rows, info = blob["metrics"], blob["info"]
    sec.add(facts_md(info), cost_md(info["cost"]), f"Reference: {PAPER}.")
    sec.add(_table([r for r in rows if r["dataset"] == "overall"], COLS, "Routers over all test requests. "
                   "Speedups are throughput ratios under the HVD cost model (target-only decoding = 1)."))
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    for name, col, caption, title, ylabel, baseline, alt in (
            ("hvd_speedup", "speedup_vs_model", "Speedup of each router over model-only drafting, per dataset.",
             "Speedup over model-only drafting", "throughput ratio (×)", 1.0, "HVD speedup per router"),
            ("hvd_cycles", "cycles_per_1k", "Target verifications per 1,000 generated tokens (lower is better).",
             "Decoding cycles per 1,000 tokens", "cycles / 1,000 tokens", None, "HVD cycles per 1000 tokens")):
        values = {d: {r["router"]: math.nan if r[col] is None else r[col] for r in rows if r["dataset"] == d}
                  for d in datasets}
        sec.add(Figure(name, caption, plots.grouped_bars(values, title, ylabel, baseline), alt=alt))
    return sec.add(
        _table([r for r in rows if r["dataset"] != "overall"], COLS, "Per dataset.", collapsed=True),
        _table(blob.get("verdict", []), VERDICT_COLS, "Goal: the best HVD router at >= 0.99x the best single "
               "drafter on every dataset (test requests decoded one at a time, one cost accounting). Oracle headroom: "
               "a clairvoyant router's throughput over the best single drafter, the most any router could reach "
               "with these drafts (avkit/hvd/verdict.py)."),
        _table(budget_records(blob.get("budget", [])) if blob.get("budget") else [], None, "Batched replay: tokens "
               "per target forward; survival+budget lets cache and model slots compete for one adaptive "
               "verification budget."),
        thresholds_md(blob.get("thresholds", {}), info) + ".")
