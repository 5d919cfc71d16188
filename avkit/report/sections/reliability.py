"""Reliability diagrams: predicted vs observed acceptance, with slots per bin, for the deployed
estimator, the other online estimator (vLLM-style `online_logistic` vs `forgetting_logistic`, replayed
on the same feature), the q_max-no-fit baseline and a confidence head where the trace has one.

Predictions are replayed exactly as `avkit fit` made them (report/traces.py), so each diagram's ECE is
the ECE in scores.json when the bin counts agree (both default to 10 equal-width bins).
"""

from __future__ import annotations

import numpy as np

from avkit.markdown import fmt
from avkit.metrics.calibration import ece_from_bins
from avkit.report import plots
from avkit.report.document import Figure, Section, Table, grid_table
from avkit.report.inputs import ReportInputs


def reliability_bins(sums: np.ndarray) -> dict:
    """[3, B] slots, summed predictions and summed labels per bin -> mean prediction, observed rate, count [B],
    and the ECE (metrics/calibration.py `ece_from_bins`, the fit's)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        pred, rate = sums[1] / sums[0], sums[2] / sums[0]
    return {"pred": pred, "rate": rate, "count": sums[0], "ece": float(ece_from_bins(sums))}


def _bin_table(panels: list[tuple[str, dict]]) -> Table:
    """Predicted bin x estimator: mean prediction / observed rate (slots); a bin with no slot '-'."""
    n_bins = len(panels[0][1]["count"])
    heads = [f"[{b / n_bins:.1f}, {(b + 1) / n_bins:.1f}{']' if b == n_bins - 1 else ')'}" for b in range(n_bins)]
    cells = {(heads[b], title): f"{fmt(float(bins['pred'][b]), 3)} / {fmt(float(bins['rate'][b]), 3)} "
                                f"({fmt(int(bins['count'][b]))})"
             for title, bins in panels for b in range(n_bins) if bins["count"][b]}
    return grid_table(cells, "predicted bin", heads, [t for t, _ in panels], collapsed=True, caption=(
        "The bins behind the diagrams: mean prediction / observed acceptance rate (slots) per bin and estimator."))


def build(inputs: ReportInputs) -> Section:
    sec = Section("reliability", "Reliability diagrams")
    if inputs.summary is None:
        return sec.omit(f"needs the traces: {inputs.notes.get('traces', '')}")
    scored = {(r["feature"], r["estimator"]): r["ece"] for r in inputs.fit.scores if r["scope"] == "all"}
    panels, short = [], []
    for title, name, feature, est, sums in inputs.summary.panels:
        bins, ece = reliability_bins(sums), scored.get((feature, est))
        bins["ece"] = bins["ece"] if ece is None else ece  # print the scored value (scores.json)
        panels.append({"title": title, **bins})
        short.append((name, bins))
    sec.add("Each marker is one bin of predicted acceptance probability: its mean prediction against the share "
            "of those slots the target accepted; marker area and the bars below give the slots per bin. "
            "On the diagonal is calibrated; the budget of adaptive verification sums these probabilities, so "
            "calibration (ECE) matters as much as ranking (AUC).")
    sec.add(Figure("reliability", "Reliability diagrams with slots per bin; ECE as in scores.json.",
                   plots.reliability(panels), alt="reliability diagrams"))
    return sec.add(_bin_table(short))
