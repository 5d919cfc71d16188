"""bench/estimators.py's diagnosis of the ECE misses: where, and in which direction, the best held-out candidates
are miscalibrated on each trace where the ECE goal is measurable and one of them misses it.

Per (trace, candidate), from its prequential predictions p and labels y (mean(p - y) > 0: it over-predicts):
- warm-up / rest: ECE and mean(p - y) of the first 1,000 slots and of the rest;
- worst position: the position of largest |mean(p - y)|, signed;
- worst bin: the 10-bin reliability bin contributing most to the ECE: its range, share of slots, mean(p - y);
- hindsight Platt: (a, b) of y ~ sigmoid(a logit(p) + b) fitted on the trace's own labels (a < 1: over-confident,
  the predictions spread too far; a > 1: under-confident) and the ECE of p through that map: where it is
  above 0.010, no monotone two-parameter recalibration of that candidate reaches the goal there;
- drift / position: the ECE after a hindsight logit shift fitted per quarter of the trace (slot order), and
  after one fitted per position: where neither moves the ECE, the miss is neither a level that drifts within
  the trace nor a per-position level.
"""

from __future__ import annotations

import numpy as np

from avkit.estimators.base import sigmoid
from avkit.metrics import ece
from avkit.estimators.platt import logit
from recalibration import platt_fit  # bench/ is on sys.path when run as a script

WARM_UP = 1000  # slots


def signed(y: np.ndarray, p: np.ndarray) -> float:
    return float(np.mean(p) - np.mean(y))


def worst_bin(y: np.ndarray, p: np.ndarray, n_bins: int = 10) -> str:
    b = np.minimum((p * n_bins).astype(int), n_bins - 1)
    n = np.bincount(b, minlength=n_bins)
    gap = np.bincount(b, weights=p - y, minlength=n_bins)  # [bins] sum (p - y): n_b * signed gap
    i = int(np.argmax(np.abs(gap)))
    return f"[{i / n_bins:.1f}, {(i + 1) / n_bins:.1f}) {n[i] / y.size:.0%}: {gap[i] / n[i]:+.3f}"


def shifted(y: np.ndarray, z: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """[N] sigmoid(z + s_g): s_g the maximum-likelihood logit shift of each group's slots (Newton)."""
    out = np.empty_like(z)
    for g in np.unique(groups):
        m, s = groups == g, 0.0
        for _ in range(50):
            q = sigmoid(z[m] + s)
            s += np.sum(y[m] - q) / max(np.sum(q * (1.0 - q)), 1e-12)
        out[m] = sigmoid(z[m] + s)
    return out


def diagnose(traces: list, rows: list[dict], preds: dict, names: tuple[str, ...]) -> list[str]:
    lines = ["| held-out trace | T | estimator | ECE | warm-up ECE / mean(p - y) | rest ECE / mean(p - y) | "
             "worst position mean(p - y) | worst bin: share, mean(p - y) | hindsight Platt a, b | ECE after it | "
             "ECE after a shift per quarter / per position |",
             "|---|---:|---|---:|---|---|---|---|---|---:|---|"]
    for t in traces:
        rs = {r["estimator"]: r for r in rows if r["trace"] == t.name}
        if not any(rs[n]["goals"][0] is False for n in names):  # measurable and missed by at least one
            continue
        y, pos = t.data.labels, t.data.positions
        for name in names:
            p, w = preds[t.name][name], slice(0, WARM_UP)
            rest = slice(WARM_UP, None)
            by_pos = [signed(y[pos == i], p[pos == i]) for i in range(pos.max() + 1)]
            i = int(np.argmax(np.abs(by_pos)))
            a, b = platt_fit(logit(p), y)
            quarter = np.arange(y.size) * 4 // y.size  # [N] 0..3 in slot order
            lines.append(f"| {t.name} | {t.temperature:g} | {name} | {rs[name]['ece']:.4f} | "
                         f"{ece(y[w], p[w]):.4f} / {signed(y[w], p[w]):+.4f} | "
                         f"{ece(y[rest], p[rest]):.4f} / {signed(y[rest], p[rest]):+.4f} | pos {i}: {by_pos[i]:+.4f} | "
                         f"{worst_bin(y, p)} | {a:.2f}, {b:+.2f} | {ece(y, sigmoid(a * logit(p) + b)):.4f} | "
                         f"{ece(y, shifted(y, logit(p), quarter)):.4f} / {ece(y, shifted(y, logit(p), pos)):.4f} |")
    return lines
