"""bench/estimators.py's tables: per held-out trace and estimator (`table`), the goal counts per estimator
(`summary`), ECE per position, through the workload shifts, and the plug-in against the debiased estimate on
request subsets. Rows are `scores`' dicts; pool and shift traces are bench/estimators.py's `Trace`s."""

from __future__ import annotations

import numpy as np

from avkit.metrics import ece
from avkit.metrics.uncertainty import debiased_ce2, signed_root

GOAL_ECE = 0.010
TUNED_ON = {"greedy_k7", "sampled_t1.0_k7"}  # ForgettingConfig's defaults were chosen on these


def table(rows: list[dict]) -> list[str]:
    lines = ["| held-out trace | T | slots | requests | estimator | ECE [95%] | floor | debiased l2 CE [95%] | "
             "log-loss | Δ log-loss vs vllm [95%] | AUC | goals |",
             "|---|---:|---:|---:|---|---|---:|---|---:|---|---:|---|"]
    for r in rows:
        prior, worst, shrink, offsets, prior_t, lam_t, w, lam, lam_gap = r["chosen"]
        mark = {"online_multi": f" ({shrink:g})", "online_shift": f" ({offsets:g})",
                "forgetting": "†" if r["trace"] in TUNED_ON else "",
                "forgetting_warm": f" ({prior:g})",
                "forgetting_gap": " ({:g}, {:g})".format(*worst),
                "forgetting_platt": f" ({lam_gap:g})",
                "forgetting_sameT_platt": f" ({prior_t:g}, {lam_t:g})",
                "blend_platt": f" ({w:g}, {lam:g})"}.get(r["estimator"], "")
        dll = "—" if r["estimator"] == "vllm" else f"[{r['dll_lo']:+.4f}, {r['dll_hi']:+.4f}]"
        lines.append(f"| {r['trace']} | {r['T']:g} | {r['slots']:,} | {r['requests']} | {r['estimator']}{mark} | "
                     f"{r['ece']:.4f} [{r['ece_lo']:.4f}, {r['ece_hi']:.4f}] | {r['floor']:.4f} | "
                     f"{r['l2']:+.4f} [{r['l2_lo']:+.4f}, {r['l2_hi']:+.4f}] | "
                     f"{r['log_loss']:.4f} | {dll} | {r['auc']:.4f} | "
                     f"{''.join('–' if g is None else '✓' if g else '✗' for g in r['goals'])} |")
    return lines


def summary(rows: list[dict], names: tuple[str, ...]) -> list[str]:
    lines = ["| estimator | ECE goal measurable (floor <= 0.010) | ECE <= 0.010 | log-loss <= vllm | "
             "AUC >= vllm - 0.002 | all three | "
             "ECE within its 95% interval of the floor | debiased l2 CE <= 0.010 | its 95% interval <= 0.010 | "
             "mean ECE | mean debiased l2 CE | mean log-loss |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    n = len({r["trace"] for r in rows})
    for name in names:
        rs = [r for r in rows if r["estimator"] == name]
        g = np.array([[bool(x) for x in r["goals"]] for r in rs])  # not measurable: not met
        near, measurable = sum(r["ece_lo"] <= r["floor"] for r in rs), sum(r["goals"][0] is not None for r in rs)
        lines.append(f"| {name} | {measurable}/{n} | {g[:, 0].sum()}/{n} | {g[:, 1].sum()}/{n} | "
                     f"{g[:, 2].sum()}/{n} | {g.all(1).sum()}/{n} | {near}/{n} | {sum(r['l2'] <= GOAL_ECE for r in rs)}/{n} | "
                     f"{sum(r['l2_hi'] <= GOAL_ECE for r in rs)}/{n} | {np.mean([r['ece'] for r in rs]):.4f} | "
                     f"{np.mean([r['l2'] for r in rs]):+.4f} | {np.mean([r['log_loss'] for r in rs]):.4f} |")
    return lines


def per_position(rows: list[dict], names: tuple[str, ...]) -> list[str]:
    lines = ["| held-out trace | estimator | " + " | ".join(f"pos {i}" for i in range(7)) + " |",
             "|---|---|" + "---:|" * 7]
    for r in rows:
        if r["estimator"] in names:
            ece_i = [r["per_position"].get(f"position={i}", float("nan")) for i in range(7)]
            lines.append(f"| {r['trace']} | {r['estimator']} | " + " | ".join(f"{e:.4f}" for e in ece_i) + " |")
    return lines


def around_shift(pool: list, shifts: list, preds: dict, names: tuple[str, ...]) -> list[str]:
    """ECE of each shift trace's first workload, of the second one's first 1,000 slots, and of the rest."""
    lines = ["| shift trace | estimator | first workload | second: first 1,000 slots | second: the rest |",
             "|---|---|---:|---:|---:|"]
    for t in shifts:
        switch = next(p.data.labels.size for p in pool if p.name == t.sources[0])
        parts = [slice(0, switch), slice(switch, switch + 1000), slice(switch + 1000, None)]
        for name in names:
            cells = [f"{ece(t.data.labels[s], preds[t.name][name][s]):.4f}" for s in parts]
            lines.append(f"| {t.name} | {name} | " + " | ".join(cells) + " |")
    return lines


def by_subset(pool: list, preds: dict, name: str = "online_sameT", draws: int = 100) -> list[str]:
    """Plug-in ECE and the debiased CE2 on random subsets of the requests of the two largest traces (`name`'s
    LOTO predictions): the plug-in's bias grows as the subset shrinks; an unbiased CE2 would not move."""
    lines = ["| trace | requests drawn | slots (mean) | mean ECE | mean CE2 | sgn sqrt of mean CE2 |",
             "|---|---:|---:|---:|---:|---:|"]
    rng = np.random.default_rng(0)
    for t in sorted(pool, key=lambda t: -t.data.labels.size)[:2]:
        y, p, names = t.data.labels, preds[t.name][name], np.unique(t.requests)
        for frac in (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1):
            drawn = max(2, round(frac * names.size))
            keeps = [np.isin(t.requests, rng.choice(names, drawn, replace=False))
                     for _ in range(draws if frac < 1 else 1)]
            e = np.mean([ece(y[k], p[k]) for k in keeps])
            c = np.mean([debiased_ce2(y[k], p[k], t.requests[k]) for k in keeps])
            lines.append(f"| {t.name} | {drawn} | {np.mean([k.sum() for k in keeps]):,.0f} | {e:.4f} | {c:.2e} | "
                         f"{signed_root(c):+.4f} |")
    return lines
