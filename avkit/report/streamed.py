"""What the report reads from the traces, out of core: additive sums over the shards' spills.

`avkit report --engine streaming` never holds the traces: pass 0 of the out-of-core fit
(fit/streaming.py `spill`: each shard read in chunks, checked, its observed slots spilled) and
then passes over the spills sum what the sections show, all additive across chunks and shards:
  acceptance   [2, D, K] observed slots and accepted slots per (dataset, position)
  drafts       dataset -> drafted slots (observed or not) and their mean draft entropy
  reliability  per panel, [3, B] slots, sum of predictions and sum of labels per equal-width
               bin of the prediction (the ECE bins of metrics/table.py)
  role fits    one batch_logistic per dataset on the deployed feature: Newton passes over the
               spills, each summing the O(K) IRLS statistics of one dataset's rows
The deployed estimator of a batch fit predicts with the coefficients of coefficients.json (the
in-memory report refits it: the same fixed point, within 1e-9). An online fit's panels replay
its estimator in engine-step order over whole traces, which this path does not hold: out of
core the report takes a batch fit (`--mode batch`), as `avkit fit --engine streaming` does.
Memory: the budget of the out-of-core fit (`FitConfig.memory_budget`), whatever the trace size.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from avkit.config import EstimatorConfig, FitConfig
from avkit.errors import ConfigError
from avkit.estimators import make_estimator
from avkit.fit.spill import ShardSurvey
from avkit.fit.engines import LocalEngine
from avkit.fit.streaming import newton, spilled
from avkit.trace.shards import check_shards

MIN_SLOTS = 50  # observed slots at position 0 a dataset needs for its own fit (the role analysis)


@dataclass
class StreamedTraces:
    """The report's view of traces it did not hold: every array is a sum over the shards."""

    k: int
    names: list[str]  # datasets, sorted
    counts: np.ndarray  # [D, K] observed slots
    accepted: np.ndarray  # [D, K] accepted slots
    drafts: dict[str, dict] = field(default_factory=dict)  # dataset -> {slots, entropy}
    panels: list[tuple] = field(default_factory=list)  # (title, short, feature, estimator, [3, B] bins)
    role_fits: list[dict] = field(default_factory=list)  # {dataset, rate, entropy, slope, b0, n}


def _panel_estimators(c: dict, k: int, present: list[str]) -> list[tuple[str, str, str, str, object]]:
    """(title, short, feature, estimator name, estimator) of each reliability panel."""
    cfg = EstimatorConfig(feature=c["feature"], refit_interval=int(c.get("refit_interval", 100)),
                          ridge=float(c.get("ridge", 1e-3)), damping=float(c.get("damping", 50.0)))
    deployed = make_estimator(c["estimator"], k=k, config=cfg)
    deployed.load_state_dict(c)  # the batch fit's converged coefficients
    out = [(f"deployed: {c['feature']} ({c['estimator']})", "deployed", c["feature"], c["estimator"], deployed)]
    for feature, est, title, short in (("q_max", "qmax", "q_max, no fit", "q_max"),
                                       ("head_conf", "passthrough", "confidence head", "head")):
        if feature in present:
            out.append((title, short, feature, est, make_estimator(est, k=k, config=replace(cfg, feature=feature))))
    return out


def _report_pass(survey: ShardSurvey, k: int, names: list[str], panels: list[tuple], n_bins: int):
    """Map step over one shard's spill -> ([2, D, K] counts and accepted, [P, 3, B] reliability bins)."""
    acc = np.zeros((2, len(names) * k))
    bins = np.zeros((len(panels), 3, n_bins))
    for c, _, pos, y, ds in survey.spilled(k, names):
        group = ds * k + pos  # [n]
        acc += [np.bincount(group, minlength=acc.shape[1]), np.bincount(group, weights=y, minlength=acc.shape[1])]
        for j, (*_, feature, _, est) in enumerate(panels):
            p = est.predict(survey.column(c, feature, np.float64), pos)  # [n]
            b = np.minimum((p * n_bins).astype(np.int64), n_bins - 1)  # the score tables' ECE bins
            bins[j] += [np.bincount(b, minlength=n_bins), np.bincount(b, weights=p, minlength=n_bins),
                        np.bincount(b, weights=y, minlength=n_bins)]
    return acc.reshape(2, len(names), k), bins


def stream_traces(paths, coefficients: dict, n_bins: int, fit: FitConfig) -> StreamedTraces:
    """Sum what the report shows over `paths` out of core (memory: `fit.memory_budget`)."""
    if coefficients.get("mode") != "batch":
        raise ConfigError("--engine streaming reports a batch fit (--mode batch): an online fit's reliability "
                          "panels replay its estimator over whole traces in memory (use --engine memory)")
    shards = check_shards(paths)
    engine = LocalEngine(fit.workers)
    with spilled(engine, shards.paths, fit, drafts=True) as (surveys, nodes, m):
        k, names = m["k"], m["names"]
        panels = _panel_estimators(coefficients, k, m["present"])
        acc, bins = engine.map(_report_pass, [(s, k, names, panels, n_bins) for s in surveys], nodes,
                               fold=lambda a, b: (a[0] + b[0], a[1] + b[1]))[0]
        drafts = {}
        for s in surveys:
            for name, (n, h) in s.drafted.items():
                d = drafts.setdefault(name, [0, 0.0])
                d[0], d[1] = d[0] + n, d[1] + h
        out = StreamedTraces(k, names, acc[0], acc[1],
                             {n: {"slots": v[0], "entropy": v[1] / v[0]} for n, v in sorted(drafts.items())})
        out.panels = [(t, short, f, e, b) for (t, short, f, e, _), b in zip(panels, bins)]
        out.role_fits = _role_fits(engine, surveys, nodes, m, coefficients["feature"], out)
    return out


def _role_fits(engine, surveys, nodes, m: dict, feature: str, t: StreamedTraces) -> list[dict]:
    """One batch fit per dataset with MIN_SLOTS first-position slots (the in-memory role analysis)."""
    todo = [j for j, n in enumerate(t.names) if t.counts[j, 0] >= MIN_SLOTS and n in t.drafts]
    plan = [(feature, "batch_logistic")] * len(todo)
    ests = [make_estimator("batch_logistic", k=t.k, config=EstimatorConfig(feature=feature)) for _ in todo]
    newton(engine, surveys, nodes, plan, ests, m, FitConfig(mode="batch"), None, subsets=todo)
    return [{"dataset": t.names[j], "rate": float(t.accepted[j].sum() / t.counts[j].sum()),
             "entropy": t.drafts[t.names[j]]["entropy"], "slope": float(e.slope), "b0": float(e.intercepts[0]),
             "n": int(t.counts[j].sum())} for j, e in zip(todo, ests)]


__all__ = ["StreamedTraces", "stream_traces"]
