"""Hybrid drafting (HVD): precision / recall of high-payoff cache drafts, decoding cycles per 1,000
tokens and speedups per router, from `avkit hvd` (hvd_metrics.json, held-out requests). The paragraphs and
tables are `avkit hvd --markdown`'s (`hvd_blocks`, avkit/hvd/markdown.py), the figures the report's own."""

from __future__ import annotations

import math

from avkit.hvd import PAPER
from avkit.hvd.markdown import cells, hvd_blocks
from avkit.report import plots
from avkit.report.document import Figure, Section, Table
from avkit.report.inputs import ReportInputs


def _figures(rows: list[dict]) -> list[Figure]:
    """Speedup over model-only drafting and cycles per 1,000 tokens, per dataset and router."""
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    return [Figure(name, caption, plots.grouped_bars(
                {d: {r["router"]: math.nan if r[col] is None else r[col] for r in rows if r["dataset"] == d}
                 for d in datasets}, title, ylabel, baseline), alt=alt)
            for name, col, caption, title, ylabel, baseline, alt in (
                ("hvd_speedup", "speedup_vs_model", "Speedup of each router over model-only drafting, per dataset.",
                 "Speedup over model-only drafting", "throughput ratio (×)", 1.0, "HVD speedup per router"),
                ("hvd_cycles", "cycles_per_1k", "Target verifications per 1,000 generated tokens (lower is better).",
                 "Decoding cycles per 1,000 tokens", "cycles / 1,000 tokens", None, "HVD cycles per 1000 tokens"))]


def build(inputs: ReportInputs) -> Section:
    sec, blob = Section("hybrid", "Hybrid drafting (cache + model)"), inputs.hvd
    if blob is None:
        return sec.omit(inputs.notes.get("hvd", "no HVD results"))
    for b in hvd_blocks(blob):
        if isinstance(b, str):
            sec.add(b)
            continue
        columns, rows, numeric = cells(b.records, b.cols)
        sec.add(Table(columns, [tuple(r) for r in rows], caption=f"{b.title}. {b.text}", numeric=tuple(numeric),
                      collapsed=b.key in ("per_dataset", "ablation")))
        if b.key == "overall":
            sec.add(*_figures(blob["metrics"]))
    return sec.add(f"Reference: {PAPER}.")
