"""Feature table (AUC, log-loss, ECE, lossless; overall and without position 0) and AUC per position.

Every number comes from scores.json as written by `avkit fit`, printed with DIGITS decimals.
"""

from __future__ import annotations

import numpy as np

from avkit.markdown import DIGITS, fmt
from avkit.report import plots
from avkit.report.document import Figure, Section, Table, grid_table
from avkit.report.inputs import ReportInputs

# the seeds (docs/seeds.md, vLLM PR #52228 write-ups): DeepSeek-V4-Flash + DSpark, ~4.5M drafts (AUC, log-loss, ECE).
SEEDS_REFERENCE = (("logit(q_max) (shipped)", 0.8336, 0.4284, 0.0100),
                   ("trained confidence head", 0.8191, 0.4449, 0.0052),
                   ("q_max, no fit", 0.8259, 0.4880, 0.0736))


def label(feature: str, estimator: str) -> str:
    return f"{feature} ({estimator})"


def score_index(scores: list[dict]) -> dict[tuple[str, str], dict[str, dict]]:
    """(feature, estimator) -> scope -> row, in scores.json order."""
    out: dict[tuple[str, str], dict[str, dict]] = {}
    for r in scores:
        out.setdefault((r["feature"], r["estimator"]), {})[r["scope"]] = r
    return out


def feature_table(scores: list[dict], deployed: tuple[str, str]) -> Table:
    rows, bold = [], set()
    for i, ((feature, est), scopes) in enumerate(score_index(scores).items()):
        a, b = scopes.get("all", {}), scopes.get("all_but_first", {})
        lossless = next(iter(scopes.values()))["lossless"]
        rows.append((feature, est, "yes" if lossless else "NO (lossy)", fmt(a.get("auc")), fmt(a.get("log_loss")),
                     fmt(a.get("ece")), fmt(b.get("auc")), fmt(b.get("log_loss")), fmt(b.get("ece")), fmt(a.get("n"))))
        if (feature, est) == deployed:
            bold |= {(i, j) for j in range(len(rows[-1]))}
    return Table(("feature", "estimator", "lossless", "AUC", "log-loss", "ECE", "AUC pos≥1", "log-loss pos≥1",
                  "ECE pos≥1", "observed slots"), rows, numeric=(False, False, False) + (True,) * 7,
                 emphasis=frozenset(bold),
                 caption="Bold: the deployed estimator. " + lossy_sentence(scores) + "Online fits are scored on "
                         "predictions made before each label was learned from (out of sample).")


def lossy_sentence(scores: list[dict]) -> str:
    """How the best lossy feature ranks against the best lossless one, in words computed from their AUCs (over
    all observed slots, compared at the DIGITS the table shows); '' without both kinds."""
    best: dict[bool, tuple[float, str]] = {}  # lossless? -> (AUC, label) of the best such row
    for r in scores:
        auc = r.get("auc")
        if r["scope"] != "all" or auc is None or auc != auc:
            continue
        if bool(r["lossless"]) not in best or auc > best[bool(r["lossless"])][0]:
            best[bool(r["lossless"])] = (auc, label(r["feature"], r["estimator"]))
    if len(best) < 2:
        return ""
    (lossy, lossy_label), (lossless, lossless_label) = best[False], best[True]
    a, b = round(lossy, DIGITS), round(lossless, DIGITS)
    verb = "rank better than" if a > b else "rank worse than" if a < b else "rank as well as"
    return (f"Lossy features (of q(x_sampled)) {verb} the lossless ones here (best AUC {fmt(lossy)}, {lossy_label}, "
            f"against {fmt(lossless)}, {lossless_label}); they bias the output distribution when used to trim drafts "
            "and are never deployed. ")


def dataset_auc_table(scores: list[dict]) -> Table | None:
    index = {label(f, e): sc for (f, e), sc in score_index(scores).items()}
    datasets = list(dict.fromkeys(s.removeprefix("dataset=") for sc in index.values() for s in sc
                                  if s.startswith("dataset=")))
    return grid_table({(name, d): sc.get(f"dataset={d}", {}).get("auc") for name, sc in index.items() for d in datasets},
                      "feature (estimator)", index, datasets,
                      caption="AUC per dataset (scores.json `dataset=` scopes).") if datasets else None


def auc_figure(scores: list[dict], k: int) -> Figure:
    curves = {}
    for (feature, est), scopes in score_index(scores).items():
        pos = sorted(int(s.split("=")[1]) for s in scopes if s.startswith("position="))
        auc = np.array([scopes[f"position={i}"]["auc"] for i in pos], dtype=float)  # None (one class) -> nan
        lossless = next(iter(scopes.values()))["lossless"]
        curves[label(feature, est) + ("" if lossless else "  [LOSSY]")] = (np.array(pos), auc, {
            "marker": "o" if lossless else "x", "linestyle": "-" if lossless else "--", "linewidth": 1.5})
    return Figure("auc_by_position", "AUC of each feature and estimator at each draft position (dashed: lossy). "
                  "Within one position, fixed coefficients make an estimator a monotone map of its feature, so "
                  "q_max, logit(q_max) and −log(−log q_max) rank nearly identically there; only the online "
                  "refits (coefficients changing over time) separate their lines.",
                  plots.position_lines(curves, k, (8.0, 4.4), 7, hline=0.5, ylabel="AUC (rank, ties = 1/2)",
                                       title="AUC per draft position, by feature and estimator"),
                  alt="AUC per draft position")


def build(inputs: ReportInputs) -> Section:
    scores, c = inputs.fit.scores, inputs.fit.coefficients
    sec = Section("features", "Features and estimators")
    sec.add(feature_table(scores, (c["feature"], c["estimator"])))
    sec.add(Table(("reference (vLLM PR #52228)", "AUC", "log-loss", "ECE"), [(n, *(fmt(x) for x in v)) for n, *v in
                                                                 SEEDS_REFERENCE],
                  caption="For comparison, vLLM's online acceptance estimator as reported in the write-ups of "
                          "vLLM PR #52228 (seeds 001/002, docs/seeds.md), on DeepSeek-V4-Flash + DSpark (~4.5M drafts); "
                          "a different model pair and workload mix, so compare orderings, not values."))
    sec.add(auc_figure(scores, int(c.get("num_positions", len(c["intercepts"])))))
    table = dataset_auc_table(scores)
    return sec.add(table) if table is not None else sec
