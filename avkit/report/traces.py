"""What the report shows of the traces: a `TraceSummary` of additive sums, from the traces in memory or
summed out of core (`avkit report --engine streaming`); the sections read only the summary.

  acceptance   [D, K] observed slots and accepted slots per (dataset, position)
  drafts       dataset -> drafted slots (observed or not) and their mean draft entropy
  reliability  per panel, [3, B] slots, sum of predictions and sum of labels per equal-width bin of the
               prediction (metrics/calibration.py `additive_sums`, the ECE bins of the fit's scores)
  role fits    one batch_logistic per dataset with MIN_SLOTS first-position slots, on the deployed feature

In memory each panel's estimator is replayed exactly as `avkit fit` made its predictions (online: each
slot with the coefficients of its refit round, before its label was learned from), so a panel's ECE is
the fit's. Out of core the report never holds the traces: pass 0 of the out-of-core fit
(fit/passes.py `spilled`: each shard read in chunks, checked, its observed slots spilled), then passes
over the spills sum the same quantities, and the role fits are Newton passes summing the O(K) IRLS
statistics of one dataset's rows. There the deployed estimator of a batch fit predicts with the
coefficients of coefficients.json (the in-memory report refits it: the same fixed point, within 1e-9).
An online fit's panels replay its estimator in engine-step order over whole traces, which this path
does not hold: out of core the report takes a batch fit (`--mode batch`), as `avkit fit --engine
streaming` does. Memory: the budget of the out-of-core fit (`FitConfig.memory_budget`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from avkit.config import EstimatorConfig, FitConfig
from avkit.errors import ConfigError
from avkit.estimators import make_estimator
from avkit.fit.data import FitData, load_fit_data
from avkit.fit.engines import LocalEngine
from avkit.fit.replay import batch_fit, online_replay
from avkit.fit.spill import ShardSurvey
from avkit.fit.passes import newton, spilled
from avkit.metrics.calibration import additive_sums
from avkit.trace.reader import read_traces
from avkit.trace.shards import check_shards

MIN_SLOTS = 50  # observed slots at position 0 a dataset needs for its own fit (the role analysis)
ONLINE_PEERS = {"online_logistic": "forgetting_logistic", "forgetting_logistic": "online_logistic"}
# the no-fit panels, where the traces hold the feature: (feature, estimator, title, short name)
NO_FIT = (("q_max", "qmax", "q_max, no fit", "q_max"), ("head_conf", "passthrough", "confidence head", "head"))


@dataclass
class TraceSummary:
    """The report's view of its traces: every array is a sum over the observed slots."""

    k: int
    names: list[str]  # datasets, sorted
    counts: np.ndarray  # [D, K] observed slots
    accepted: np.ndarray  # [D, K] accepted slots
    drafts: dict[str, dict] = field(default_factory=dict)  # dataset -> {slots, entropy}
    panels: list[tuple] = field(default_factory=list)  # (title, short, feature, estimator, [3, B] bin sums)
    role_fits: list[dict] = field(default_factory=list)  # {dataset, rate, entropy, slope, b0, n}


def bin_sums(p: np.ndarray, y: np.ndarray, n_bins: int) -> np.ndarray:
    """[N] predictions and labels -> [3, B] slots, summed predictions, summed labels per equal-width bin."""
    return additive_sums(p, y, np.zeros(len(p), np.int64), 1, 1, n_bins)[1][:, 0, 0]


def deployed_estimator(c: dict, k: int, name: str | None = None):
    """A fresh estimator `name` (default: the deployed one) with the settings of coefficients.json `c`."""
    cfg = EstimatorConfig(feature=c["feature"], refit_interval=int(c.get("refit_interval", 100)),
                          ridge=float(c.get("ridge", 1e-3)), damping=float(c.get("damping", 50.0)))
    return make_estimator(name or c["estimator"], k=k, config=cfg)


def deployed_predictions(data: FitData, c: dict, name: str | None = None) -> np.ndarray:
    """[N] predictions of the deployed estimator (or its online peer `name`), replayed as the fit made them."""
    est, values = deployed_estimator(c, data.k, name), data.features[c["feature"]]
    if c.get("mode") == "batch":
        return batch_fit(est, data, values, max_iter=FitConfig().max_iter, tol=FitConfig().tol)[0]
    return online_replay(est, data, values)[0]


def summarize(paths, c: dict, n_bins: int) -> TraceSummary:
    """The summary of `paths` read into memory, for the fit whose coefficients.json is `c`."""
    data = load_fit_data(paths)
    k = data.k
    group = data.dataset_codes * k + data.positions  # [N]
    size = len(data.dataset_names) * k
    counts = np.bincount(group, minlength=size).reshape(-1, k).astype(np.float64)
    accepted = np.bincount(group, weights=data.labels, minlength=size).reshape(-1, k)
    df = read_traces(paths, ["dataset", "entropy"], check=False)  # every drafted slot, observed or not
    agg = (df.group_by(pl.col("dataset").cast(pl.String))
           .agg(pl.len().alias("slots"), pl.col("entropy").cast(pl.Float64).mean()).sort("dataset"))
    drafts = {r["dataset"]: {"slots": r["slots"], "entropy": r["entropy"]} for r in agg.iter_rows(named=True)}
    out = TraceSummary(k, data.dataset_names, counts, accepted, drafts)
    predicted = [(f"deployed: {c['feature']} ({c['estimator']})", "deployed", c["feature"], c["estimator"],
                  deployed_predictions(data, c))]
    peer = ONLINE_PEERS.get(c["estimator"]) if c.get("mode", "online") == "online" else None
    if peer is not None:  # the other online estimator, replayed the same way on the same feature
        predicted.append((f"{c['feature']} ({peer})", peer, c["feature"], peer, deployed_predictions(data, c, peer)))
    predicted += [(title, short, feature, est, make_estimator(est, k=k).predict(data.features[feature], data.positions))
                  for feature, est, title, short in NO_FIT if feature in data.features]
    out.panels = [(*head, bin_sums(p, data.labels, n_bins)) for *head, p in predicted]
    for j, name in enumerate(data.dataset_names):
        mask = data.dataset_codes == j
        if (data.positions[mask] == 0).sum() < MIN_SLOTS or name not in drafts:
            continue
        part = replace(data, features={n: v[mask] for n, v in data.features.items()}, positions=data.positions[mask],
                       labels=data.labels[mask], row_step=data.row_step[mask], file_index=data.file_index[mask],
                       dataset_codes=data.dataset_codes[mask])
        est = make_estimator("batch_logistic", k=k, config=EstimatorConfig(feature=c["feature"]))
        batch_fit(est, part, part.features[c["feature"]], max_iter=FitConfig().max_iter, tol=FitConfig().tol)
        out.role_fits.append({"dataset": name, "rate": float(part.labels.mean()), "entropy": drafts[name]["entropy"],
                              "slope": float(est.slope), "b0": float(est.intercepts[0]), "n": len(part.labels)})
    return out


def _report_pass(survey: ShardSurvey, k: int, names: list[str], panels: list[tuple], n_bins: int):
    """Map step over one shard's spill -> ([2, D, K] counts and accepted, [P, 3, B] reliability bins)."""
    acc = np.zeros((2, len(names) * k))
    bins = np.zeros((len(panels), 3, n_bins))
    for c, _, pos, y, ds in survey.chunks(k, names):
        group = ds * k + pos  # [n]
        acc += [np.bincount(group, minlength=acc.shape[1]), np.bincount(group, weights=y, minlength=acc.shape[1])]
        for j, (*_, feature, _, est) in enumerate(panels):
            bins[j] += bin_sums(est.predict(survey.column(c, feature, np.float64), pos), y, n_bins)
    return acc.reshape(2, len(names), k), bins


def stream_traces(paths, c: dict, n_bins: int, fit: FitConfig) -> TraceSummary:
    """The summary of `paths` summed out of core (memory: `fit.memory_budget`)."""
    if c.get("mode") != "batch":
        raise ConfigError("--engine streaming reports a batch fit (--mode batch): an online fit's reliability "
                          "panels replay its estimator over whole traces in memory (use --engine memory)")
    engine = LocalEngine(fit.workers)
    with spilled(engine, check_shards(paths), fit, drafts=True) as (surveys, nodes, m):
        k, names = m["k"], m["names"]
        deployed = deployed_estimator(c, k)
        deployed.load_state_dict(c)  # the batch fit's converged coefficients
        panels = [(f"deployed: {c['feature']} ({c['estimator']})", "deployed", c["feature"], c["estimator"], deployed)]
        panels += [(title, short, feature, est, make_estimator(est, k=k)) for feature, est, title, short in NO_FIT
                   if feature in m["present"]]
        acc, bins = engine.map(_report_pass, [(s, k, names, panels, n_bins) for s in surveys], nodes,
                               fold=lambda a, b: (a[0] + b[0], a[1] + b[1]))[0]
        drafts = {}
        for s in surveys:
            for name, (n, h) in s.drafted.items():
                d = drafts.setdefault(name, [0, 0.0])
                d[0], d[1] = d[0] + n, d[1] + h
        out = TraceSummary(k, names, acc[0], acc[1],
                           {n: {"slots": v[0], "entropy": v[1] / v[0]} for n, v in sorted(drafts.items())})
        out.panels = [(t, short, f, e, b) for (t, short, f, e, _), b in zip(panels, bins)]
        # one batch fit per dataset with MIN_SLOTS first-position slots, as in memory
        todo = [j for j, n in enumerate(names) if out.counts[j, 0] >= MIN_SLOTS and n in out.drafts]
        ests = [make_estimator("batch_logistic", k=k, config=EstimatorConfig(feature=c["feature"])) for _ in todo]
        newton(engine, surveys, nodes, [(c["feature"], "batch_logistic")] * len(todo), ests, m,
               FitConfig(mode="batch"), None, subsets=todo)
        out.role_fits = [{"dataset": names[j], "rate": float(out.accepted[j].sum() / out.counts[j].sum()),
                          "entropy": out.drafts[names[j]]["entropy"], "slope": float(e.slope),
                          "b0": float(e.intercepts[0]), "n": int(out.counts[j].sum())} for j, e in zip(todo, ests)]
    return out


__all__ = ["MIN_SLOTS", "TraceSummary", "bin_sums", "deployed_predictions", "stream_traces", "summarize"]
