"""Reliability diagrams: predicted vs observed acceptance, with slots per bin, for the deployed
estimator, the other online estimator (vLLM-style `online_logistic` vs `forgetting_logistic`, replayed
on the same feature), the q_max-no-fit baseline and a confidence head where the trace has one.

Predictions are replayed exactly as `avkit fit` made them (online: each slot predicted with the
coefficients of its refit round, before its label was learned from), so each diagram's ECE is the
ECE in scores.json when the bin counts agree (both default to 10 equal-width bins).
"""

from __future__ import annotations

import numpy as np

from avkit.config import EstimatorConfig, FitConfig, ReportConfig
from avkit.estimators import make_estimator
from avkit.fit.data import FitData
from avkit.fit.replay import batch_fit, online_replay
from avkit.report import plots
from avkit.report.document import Figure, Section, Table, fmt
from avkit.report.inputs import ReportInputs


def reliability_bins(p: np.ndarray, y: np.ndarray, n_bins: int) -> dict:
    """[N] predictions and labels -> per equal-width bin: mean prediction, observed rate, count [B]."""
    b = np.minimum((p * n_bins).astype(np.int64), n_bins - 1)  # same binning as the score tables' ECE
    return bins_from_sums(np.bincount(b, minlength=n_bins).astype(np.float64),
                          np.bincount(b, weights=p, minlength=n_bins), np.bincount(b, weights=y, minlength=n_bins))


def bins_from_sums(count: np.ndarray, sum_p: np.ndarray, sum_y: np.ndarray) -> dict:
    """[B] slots, summed predictions and summed labels per bin (additive) -> the reliability bins."""
    with np.errstate(invalid="ignore", divide="ignore"):
        pred, rate = sum_p / count, sum_y / count
    ece = float(np.nansum(np.abs(pred - rate) * count) / count.sum())
    return {"pred": pred, "rate": rate, "count": count, "ece": ece}


ONLINE_PEERS = {"online_logistic": "forgetting_logistic", "forgetting_logistic": "online_logistic"}


def deployed_predictions(data: FitData, c: dict) -> np.ndarray:
    """[N] predictions of the deployed estimator, replayed as the fit made them."""
    cfg = EstimatorConfig(feature=c["feature"], refit_interval=int(c.get("refit_interval", 100)),
                          ridge=float(c.get("ridge", 1e-3)), damping=float(c.get("damping", 50.0)))
    est = make_estimator(c["estimator"], k=data.k, config=cfg)
    values = data.features[c["feature"]]
    if c.get("mode") == "batch":
        fit = FitConfig()
        return batch_fit(est, data, values, max_iter=fit.max_iter, tol=fit.tol)[0]
    return online_replay(est, data, values)[0]


def _panels(inputs: ReportInputs) -> list[tuple[str, str, str, str, np.ndarray]]:
    """(title, short name, feature, estimator, predictions [N]) for each estimator the traces support."""
    data, c = inputs.data, inputs.fit.coefficients
    out = [(f"deployed: {c['feature']} ({c['estimator']})", "deployed", c["feature"], c["estimator"],
            deployed_predictions(data, c))]
    peer = ONLINE_PEERS.get(c["estimator"]) if c.get("mode", "online") == "online" else None
    if peer is not None:  # the other online estimator, replayed the same way on the same feature
        out.append((f"{c['feature']} ({peer})", peer, c["feature"], peer,
                    deployed_predictions(data, {**c, "estimator": peer})))
    no_fit = (("q_max", "qmax", "q_max, no fit", "q_max"), ("head_conf", "passthrough", "confidence head", "head"))
    for feature, est, title, short in no_fit:
        if feature in data.features:
            p = make_estimator(est, k=data.k).predict(data.features[feature], data.positions)
            out.append((title, short, feature, est, p))
    return out


def _panel_bins(inputs: ReportInputs, n_bins: int) -> list[tuple[str, str, str, str, dict]]:
    """(title, short name, feature, estimator, reliability bins) of each panel: from the predictions
    (traces in memory) or from the summed bins (out of core, report/streamed.py)."""
    if inputs.streamed is None:
        return [(*head, reliability_bins(p, inputs.data.labels, n_bins)) for *head, p in _panels(inputs)]
    return [(*head, bins_from_sums(*sums)) for *head, sums in inputs.streamed.panels]


def _bin_table(panels: list[tuple[str, dict]], n_bins: int) -> Table:
    rows = []
    for b in range(n_bins):
        cells = [f"[{b / n_bins:.1f}, {(b + 1) / n_bins:.1f}{']' if b == n_bins - 1 else ')'}"]
        for _, bins in panels:  # one cell per estimator keeps the table narrow: pred / obs (slots)
            cells.append("-" if bins["count"][b] == 0 else
                         f"{fmt(float(bins['pred'][b]), 3)} / {fmt(float(bins['rate'][b]), 3)} "
                         f"({fmt(int(bins['count'][b]))})")
        rows.append(tuple(cells))
    cols = ["predicted bin"] + [t for t, _ in panels]
    return Table(tuple(cols), rows, collapsed=True, caption="The bins behind the diagrams: mean prediction / "
                 "observed acceptance rate (slots) per bin and estimator.")


def build(inputs: ReportInputs, config: ReportConfig) -> Section:
    sec = Section("reliability", "Reliability diagrams")
    if inputs.data is None and inputs.streamed is None:
        return sec.omit(f"needs the traces: {inputs.notes.get('traces', '')}")
    scored = {(r["feature"], r["estimator"]): r["ece"] for r in inputs.fit.scores if r["scope"] == "all"}
    panels, short = [], []
    for title, name, feature, est, bins in _panel_bins(inputs, config.bins):
        ece = scored.get((feature, est))
        bins["ece"] = bins["ece"] if ece is None else ece  # print the scored value (scores.json)
        panels.append({"title": title, **bins})
        short.append((name, bins))
    sec.add("Each marker is one bin of predicted acceptance probability: its mean prediction against the share "
            "of those slots the target accepted; marker area and the bars below give the slots per bin. "
            "On the diagonal is calibrated; the budget of adaptive verification sums these probabilities, so "
            "calibration (ECE) matters as much as ranking (AUC).")
    sec.add(Figure("reliability", "Reliability diagrams with slots per bin; ECE as in scores.json.",
                   plots.reliability(panels), alt="reliability diagrams"))
    return sec.add(_bin_table(short, config.bins))
