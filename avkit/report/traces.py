"""What the report shows of the traces: a `TraceSummary` of additive sums over the shards of the batch
fit (fit/passes.py), held in memory or spilled and summed out of core (`avkit report --engine streaming`,
docs/fleet.md). A deployed panel predicts as `avkit fit` did, so its ECE is the fit's: a batch fit's
converged coefficients on every slot; an online fit's estimator replayed in engine-step order over whole
traces, which needs them in memory (out of core the report takes a batch fit).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from avkit.config import EstimatorConfig, FitConfig
from avkit.errors import ConfigError
from avkit.estimators import make_estimator
from avkit.fit.data import FitData, add_drafts, load_fit_data
from avkit.fit.engines import LocalEngine
from avkit.fit.passes import held, newton, spilled
from avkit.fit.replay import online_replay
from avkit.metrics.calibration import bin_sums
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


def deployed_estimator(c: dict, k: int, name: str | None = None):
    """A fresh estimator `name` (default: the deployed one) with the settings of coefficients.json `c`."""
    cfg = EstimatorConfig(feature=c["feature"], **{f: c[f] for f in ("refit_interval", "ridge", "damping") if f in c})
    return make_estimator(name or c["estimator"], k=k, config=cfg)  # a setting c lacks: the config's default


def replayed_panels(data: FitData, c: dict, n_bins: int) -> list[tuple]:
    """The panels of an online fit: its estimator and its online peer, replayed as the fit made them."""
    peer = ONLINE_PEERS.get(c["estimator"])
    heads = [(f"deployed: {c['feature']} ({c['estimator']})", "deployed", c["feature"], c["estimator"])]
    heads += [] if peer is None else [(f"{c['feature']} ({peer})", peer, c["feature"], peer)]
    replay = [online_replay(deployed_estimator(c, data.k, h[3]), data, data.features[c["feature"]])[0] for h in heads]
    return [(*head, bin_sums(p, data.labels, n_bins)) for head, p in zip(heads, replay)]


def _report_pass(shard, k: int, names: list[str], panels: list[tuple], n_bins: int):
    """Map step over one shard -> ([2, D, K] counts and accepted, [P, 3, B] reliability bins)."""
    acc = np.zeros((2, len(names) * k))
    bins = np.zeros((len(panels), 3, n_bins))
    for c, _, pos, y, ds in shard.chunks(k, names):
        group = ds * k + pos  # [n]
        acc += [np.bincount(group, minlength=acc.shape[1]), np.bincount(group, weights=y, minlength=acc.shape[1])]
        for j, (*_, feature, _, est) in enumerate(panels):
            bins[j] += bin_sums(est.predict(shard.column(c, feature, np.float64), pos), y, n_bins)
    return acc.reshape(2, len(names), k), bins


def summarize(paths, c: dict, n_bins: int, fit: FitConfig | None = None) -> TraceSummary:
    """The summary of `paths` for the fit whose coefficients.json is `c`: held in memory (`fit` None), or
    summed out of core by `fit` (an out-of-core FitConfig: its budget and scratch)."""
    batch, shards, fit = c.get("mode") == "batch", check_shards(paths), fit or FitConfig(mode="batch")
    data, replayed, drafts = None, [], {}
    if fit.engine == "memory":
        data = load_fit_data(shards.paths, drafted=drafts)  # drafts: every drafted slot, observed or not
        replayed = [] if batch else replayed_panels(data, c, n_bins)
    elif not batch:
        raise ConfigError("--engine streaming reports a batch fit (--mode batch): an online fit's reliability "
                          "panels replay its estimator over whole traces in memory (use --engine memory)")
    with LocalEngine(fit.workers) as engine, (held(shards, fit, data) if fit.engine == "memory" else
                                              spilled(engine, shards, fit, drafts=True)) as (parts, nodes, m):
        k, names = m["k"], m["names"]
        panels = []
        if batch:
            deployed = deployed_estimator(c, k)
            deployed.load_state_dict(c)  # the batch fit's converged coefficients
            panels = [(f"deployed: {c['feature']} ({c['estimator']})", "deployed", c["feature"], c["estimator"],
                       deployed)]
        panels += [(title, short, feature, est, make_estimator(est, k=k)) for feature, est, title, short in NO_FIT
                   if feature in m["present"]]
        acc, bins = engine.map(_report_pass, [(s, k, names, panels, n_bins) for s in parts], nodes,
                               fold=lambda a, b: (a[0] + b[0], a[1] + b[1]))[0]
        for s in parts:  # spilled shards' drafted slots (a held shard's: counted by load_fit_data above)
            add_drafts(drafts, s.drafted)
        out = TraceSummary(k, names, acc[0], acc[1],
                           {n: {"slots": v[0], "entropy": v[1] / v[0]} for n, v in sorted(drafts.items())})
        out.panels = replayed + [(t, short, f, e, b) for (t, short, f, e, _), b in zip(panels, bins)]
        # one batch fit per dataset with MIN_SLOTS first-position slots
        todo = [j for j, n in enumerate(names) if out.counts[j, 0] >= MIN_SLOTS and n in out.drafts]
        ests = [make_estimator("batch_logistic", k=k, config=EstimatorConfig(feature=c["feature"])) for _ in todo]
        newton(engine, parts, nodes, [(c["feature"], "batch_logistic")] * len(todo), ests, m,
               FitConfig(mode="batch"), None, subsets=todo)
        out.role_fits = [{"dataset": names[j], "rate": float(out.accepted[j].sum() / out.counts[j].sum()),
                          "entropy": out.drafts[names[j]]["entropy"], "slope": float(e.slope),
                          "b0": float(e.intercepts[0]), "n": int(out.counts[j].sum())} for j, e in zip(todo, ests)]
    return out
