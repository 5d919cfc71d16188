"""Summary: model pair, datasets, drafts, acceptance rate per position, the deployed coefficients."""

from __future__ import annotations

import numpy as np

from avkit.markdown import fmt
from avkit.report import plots
from avkit.report.document import Figure, Section, Table
from avkit.report.inputs import ReportInputs
from avkit.report.sections.features import SEEDS_REFERENCE
from avkit.report.traces import TraceSummary


def _coefficients_table(c: dict) -> Table:
    k = len(c["intercepts"])
    obs = c.get("observations") or [None] * k
    rows = [("slope ω", fmt(float(c["slope"])), fmt(sum(o for o in obs if o) if obs[0] is not None else None))]
    rows += [(f"intercept β{i}", fmt(float(b)), fmt(obs[i])) for i, b in enumerate(c["intercepts"])]
    sign = "" if c.get("feature_sign", 1.0) == 1.0 else f"{c['feature_sign']:+g} × "
    return Table(("coefficient", "value", "observations"), rows,
                 caption=f"Deployed estimator ({c['estimator']}, {c.get('mode', '?')} fit): "
                         f"p_i = σ(ω · {sign}{c['feature']} + β_i); refit every {c.get('refit_interval', '?')} "
                         f"engine steps, ridge {c.get('ridge', '?')}, damping n/(n+{c.get('damping', '?')}).")


def _dataset_table(t: TraceSummary) -> Table:
    n, acc = t.counts, t.accepted
    rows = [(name, fmt(t.drafts.get(name, {}).get("slots")), fmt(int(n[j].sum())),
             fmt(float(acc[j].sum() / n[j].sum()), 3), fmt(t.drafts.get(name, {}).get("entropy"), 3))
            for j, name in enumerate(t.names)]
    total = sum(d["slots"] for d in t.drafts.values())
    rows.append(("all", fmt(total), fmt(int(n.sum())), fmt(float(acc.sum() / n.sum()), 3), "-"))
    return Table(("dataset", "drafted slots", "observed slots", "acceptance rate", "mean draft entropy (nats)"),
                 rows, caption="Observed = verified and at or before the first rejection (carries a label); "
                               "acceptance rate = accepted / observed.")


def _position_block(t: TraceSummary) -> list:
    n = t.counts.sum(0)  # [K]
    k = len(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = t.accepted.sum(0) / n  # [K] nan where a position has no observed slot
        per_ds = list(t.accepted / t.counts)  # [D] x [K]
        half = 1.96 * np.sqrt(rate * (1 - rate) / n)  # [K] normal-approximation 95% interval
    curves = {"all datasets": (np.arange(k), rate, {"marker": "o", "color": "black", "linewidth": 2.4, "zorder": 3}),
              **{name: (np.arange(k), r, {"marker": "o", "linewidth": 1.4, "zorder": 2})
                 for name, r in zip(t.names, per_ds)}}
    reach = np.r_[1.0, np.cumprod(np.nan_to_num(rate, nan=0.0))[:-1]]  # P(all earlier drafts accepted)
    rows = [(str(i), fmt(int(n[i])), fmt(float(rate[i]), 3), fmt(float(reach[i]), 3),
             *(fmt(float(r[i]), 3) for r in per_ds)) for i in range(k)]
    table = Table(("position", "observed slots", "acceptance rate", "P(reached)", *t.names), rows,
                  caption="P(reached) = product of the acceptance rates of earlier positions (all drafts verified).")
    fig = Figure("acceptance_by_position", "Observed acceptance rate per draft position, overall (band: 95% "
                 "interval) and per dataset.",
                 plots.position_lines(curves, k, (7.0, 3.8), 8, band=half, ylim=(0, 1.02), ylabel="P(accept | reached, "
                                      "verified)", title="Acceptance rate per draft position (observed slots)"),
                 alt="acceptance rate per draft position")
    return [table, fig]


def _headline(inputs: ReportInputs) -> str:
    """The deployed estimator's scores (from scores.json) in one sentence."""
    c = inputs.fit.coefficients
    row = next((r for r in inputs.fit.scores if r["scope"] == "all" and r["feature"] == c["feature"]
                and r["estimator"] == c["estimator"]), None)
    if row is None:
        return f"The deployed estimator ({c['feature']}, {c['estimator']}) has no row in scores.json."
    return (f"Deployed: {c['estimator']} on {c['feature']}, slope ω = {fmt(float(c['slope']))}. Over "
            f"{fmt(row['n'])} observed slots it scores AUC {fmt(row['auc'])}, log-loss {fmt(row['log_loss'])}, "
            f"ECE {fmt(row['ece'])} (vLLM's shipped estimator on DeepSeek-V4-Flash + DSpark, from the write-ups of "
            f"vLLM PR #52228: {' / '.join(fmt(x) for x in SEEDS_REFERENCE[0][1:])}; seeds 001/002, docs/seeds.md).")


def build(inputs: ReportInputs) -> Section:
    c = inputs.fit.coefficients
    t = c.get("trained_on", {})
    sec = Section("summary", "Summary")
    sec.add(f"Target {t.get('target') or '?'}, draft {t.get('draft') or '?'}, K = {c.get('num_positions', '?')} "
            f"draft positions. {fmt(t.get('slots'))} draft slots, {fmt(t.get('observed'))} observed, "
            f"from {len(t.get('traces', []))} trace file(s).", _headline(inputs))
    if inputs.summary is None:
        sec.add(f"Per-dataset and per-position acceptance need the traces: {inputs.notes.get('traces', '')}.")
    else:
        sec.add(_dataset_table(inputs.summary), *_position_block(inputs.summary))
    return sec.add(_coefficients_table(c))
