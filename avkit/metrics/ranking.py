"""The area under the ROC curve as a rank statistic, over [N] labels y_n in {0, 1}, real scores (higher:
more likely accepted) and optional weights w_n >= 0:
AUC = P(score of a random positive > score of a random negative) + 1/2 P(tie): the Mann-Whitney
statistic with ties counted 1/2, so it equals sklearn's `roc_auc_score` (trapezoidal ROC area).
Degenerate input: one class present -> `UndefinedMetricWarning` and nan (as sklearn).
"""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl

from avkit.metrics.calibration import UndefinedMetricWarning, check_binary_inputs


def auc(labels, scores, sample_weight=None) -> float:
    """Area under the ROC curve of [N] labels in {0, 1} and finite scores (optional weights >= 0); ties
    between a positive and a negative count 1/2; nan with an `UndefinedMetricWarning` for one class.

    >>> auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    0.75
    """
    y, s, w = check_binary_inputs(labels, scores, sample_weight, name="scores", probabilities=False)
    order = pl.Series(s).arg_sort().to_numpy()  # polars' parallel sort: ~2x numpy on millions of rows
    y, s = y[order], s[order]
    pos = y if w is None else w[order] * y  # [N] positive mass per row
    neg = (1.0 - y) if w is None else w[order] * (1.0 - y)  # [N] negative mass per row
    total_pos, total_neg = pos.sum(), neg.sum()
    if total_pos <= 0 or total_neg <= 0:
        warnings.warn("only one class present in labels: AUC is undefined, returning nan",
                      UndefinedMetricWarning, stacklevel=2)
        return float("nan")
    # A positive row carries no negative mass, so the running negative mass at it counts the
    # negatives ranked below it, exactly, when no scores tie.
    wins = float(np.dot(pos, np.cumsum(neg)))
    tied = s[1:] == s[:-1]  # [N-1] row i+1 ties row i
    if tied.any():
        rows = np.flatnonzero(np.r_[tied, False] | np.r_[False, tied])  # [T] rows inside tie groups
        block = np.cumsum(~np.r_[False, tied][rows])  # [T] tie group of each (one opens where row i+1 != row i)
        wins += float(tie_correction(block, pos[rows], neg[rows])[0])
    return wins / (total_pos * total_neg)


def tie_correction(block: np.ndarray, pos: np.ndarray, neg: np.ndarray, codes: np.ndarray | None = None,
                   num_codes: int = 1) -> np.ndarray:
    """Rows inside runs of tied scores ([T] each, in ascending order of the score: run id, positive and
    negative mass, code: a scope, None: one) -> [C] what turns each code's ordered win count (the negatives
    before each positive) into the Mann-Whitney count: a positive's tied negatives of its code count 1/2,
    not 1 (before it) or 0 (after it). The one tie rule of the exact AUCs (`auc`, metrics/table.py).
    O(T log T)."""
    c = np.zeros(block.size, np.int64) if codes is None else codes
    order = np.argsort(c, kind="stable")  # [T] grouped by code, still in ascending order inside
    c, p, q, b = c[order], pos[order], neg[order], block[order]
    start = np.r_[True, (c[1:] != c[:-1]) | (b[1:] != b[:-1])]  # [T] opens a (code, run) segment
    seg = np.cumsum(start) - 1  # [T]
    before = np.cumsum(q) - q  # [T] negative mass before each row
    before -= before[start][seg]  # ... inside its own segment
    seg_neg = np.bincount(seg, weights=q)  # [S] negative mass per segment
    return np.bincount(c, weights=p * (0.5 * seg_neg[seg] - before), minlength=num_codes)
