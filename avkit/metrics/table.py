"""Score tables: every metric over the standard scopes of a trace (DESIGN.md §3).

Scopes:
  all               every observed slot
  all_but_first     positions >= 1 (position 0 is easy and dominates the pooled AUC)
  position=i        draft position i
  dataset=NAME      one workload
Cost is one sort of the predictions plus O(N) passes, whatever the number of scopes:
  AUC      a stable counting sort by group code of the score-sorted rows keeps every group's
           rows contiguous and still sorted by score, so each group's AUC is an O(n_g) slice
  log-loss per-row NLL once, then per-group sums (np.bincount)
  ECE      per-(group, bin) sums of p, y and counts; a union of groups sums its rows of the table
"""

from __future__ import annotations

import warnings

import numpy as np

from avkit.errors import DataError
from avkit.metrics.calibration import _EPS
from avkit.metrics.checks import UndefinedMetricWarning, check_binary_inputs
from avkit.metrics.ranking import argsort, auc_sorted


def _grouped_auc(y_s: np.ndarray, p_s: np.ndarray, codes_s: np.ndarray, num_groups: int) -> np.ndarray:
    """[N] score-sorted labels, scores, group codes -> [G] AUC per group (nan if one class)."""
    g_order = np.argsort(codes_s.astype(np.int16), kind="stable")  # counting sort: stays score-sorted within a group
    y_g, p_g = y_s[g_order], p_s[g_order]
    ends = np.cumsum(np.bincount(codes_s, minlength=num_groups))
    out = np.full(num_groups, np.nan)
    for g, (lo, hi) in enumerate(zip(np.r_[0, ends[:-1]], ends)):
        if hi > lo:
            out[g] = auc_sorted(y_g[lo:hi], p_g[lo:hi])
    return out


def _bin_sums(codes: np.ndarray, bins: np.ndarray, p: np.ndarray, y: np.ndarray, num_groups: int,
              n_bins: int) -> np.ndarray:
    """-> [3, G, n_bins] (count, sum p, sum y) per group and probability bin."""
    key = codes * n_bins + bins
    size = num_groups * n_bins
    sums = [np.bincount(key, minlength=size), np.bincount(key, weights=p, minlength=size),
            np.bincount(key, weights=y, minlength=size)]
    return np.stack(sums).astype(np.float64).reshape(3, num_groups, n_bins)


def _ece(table: np.ndarray) -> np.ndarray:
    """[3, ..., n_bins] bin sums -> [...] ECE = sum_b |sum p_b - sum y_b| / total."""
    return np.abs(table[1] - table[2]).sum(-1) / table[0].sum(-1)


def _partition_rows(prefix, names, codes, y_s, p_s, codes_s, nll, table, n_bins) -> list[dict]:
    num = len(names)
    counts = np.bincount(codes, minlength=num)
    aucs = _grouped_auc(y_s, p_s, codes_s, num)
    ll = np.bincount(codes, weights=nll, minlength=num)
    eces = _ece(table)
    return [{"scope": f"{prefix}={names[g]}", "auc": float(aucs[g]), "log_loss": float(ll[g] / counts[g]),
             "ece": float(eces[g]), "n": int(counts[g])} for g in range(num) if counts[g] > 0]


def score_table(labels, probs, positions, dataset_codes=None, dataset_names=None,
                n_bins: int = 10) -> list[dict]:
    """Rows {scope, auc, log_loss, ece, n} for the standard scopes; AUC is nan for one class.

    Parameters
    ----------
    labels, probs : array-like [N]      labels in {0, 1}, predictions in [0, 1]
    positions : array-like [N] of int   draft position of each slot
    dataset_codes : array-like [N] of int, optional   index into `dataset_names`

    Examples
    --------
    >>> rows = score_table([0, 1, 1, 0], [0.2, 0.7, 0.6, 0.4], [0, 0, 1, 1])
    >>> [(r["scope"], r["auc"], r["n"]) for r in rows]
    [('all', 1.0, 4), ('all_but_first', 1.0, 2), ('position=0', 1.0, 2), ('position=1', 1.0, 2)]
    """
    y, p, _ = check_binary_inputs(labels, probs, name="probs", probabilities=True)
    pos = np.asarray(positions, dtype=np.int64)
    if pos.shape != y.shape or (pos.size and pos.min() < 0):
        raise DataError(f"positions must be [N] non-negative integers matching labels, got shape {pos.shape}")
    order = argsort(p)  # [N] the one sort
    y_s, p_s = y[order], p[order]
    # NLL = -log of the probability given to the observed label, clipped as sklearn does.
    nll = -np.log(np.clip(np.where(y > 0, p, 1.0 - p), _EPS, 1 - _EPS))  # [N]
    bins = np.minimum((p * n_bins).astype(np.int64), n_bins - 1)  # [N]
    k = int(pos.max()) + 1
    pos_table = _bin_sums(pos, bins, p, y, k, n_bins)  # [3, K, n_bins]
    rest = pos > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        rows = [{"scope": "all", "auc": auc_sorted(y_s, p_s), "log_loss": float(nll.mean()),
                 "ece": float(_ece(pos_table.sum(1))), "n": len(y)}]
        if rest.any():
            rest_s = pos[order] > 0
            rows.append({"scope": "all_but_first", "auc": auc_sorted(y_s[rest_s], p_s[rest_s]),
                         "log_loss": float(nll[rest].mean()), "ece": float(_ece(pos_table[:, 1:].sum(1))),
                         "n": int(rest.sum())})
        rows += _partition_rows("position", list(range(k)), pos, y_s, p_s, pos[order], nll, pos_table, n_bins)
        if dataset_codes is not None:
            ds = np.asarray(dataset_codes, dtype=np.int64)
            table = _bin_sums(ds, bins, p, y, len(dataset_names), n_bins)
            rows += _partition_rows("dataset", dataset_names, ds, y_s, p_s, ds[order], nll, table, n_bins)
    return rows


__all__ = ["score_table"]
