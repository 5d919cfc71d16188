"""Score tables: every metric over the standard scopes of a trace (docs/estimator.md).

Scopes:
  all               every observed slot
  all_but_first     positions >= 1 (position 0 is easy and dominates the pooled AUC)
  position=i        draft position i
  dataset=NAME      one workload
`ScoreLayout` holds what does not depend on the predictions (labels, groups = dataset x position,
counts) and is built once per trace set; scoring one feature then costs one sort plus O(N) passes:
  AUC      one radix sort of packed uint64 keys: the prediction's float64 bits (a non-negative
           double orders like its bit pattern) with the low `bits` mantissa bits replaced by
           (group, label). The sorted keys carry labels and groups along, so nothing is gathered.
           A stable counting sort by group keeps each group's rows contiguous and still sorted,
           so each group's AUC is an O(n_g) slice. Predictions are ranked at a relative
           resolution of 2^-(52 - bits) (bits <= 12): two predictions closer than that count as
           a tie (1/2) where an exact ranking would order them. The public `auc` is exact.
  log-loss per-row NLL once, then per-group sums
  ECE      per-(group, bin) sums of p, y and counts; a union of groups sums its rows of the table
"""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl

from avkit.errors import DataError
from avkit.metrics.calibration import _EPS
from avkit.metrics.checks import UndefinedMetricWarning, check_binary_inputs
from avkit.metrics.ranking import auc_sorted

MAX_KEY_BITS = 12  # label + group bits packed below the prediction's bits


def _grouped_auc(y_s: np.ndarray, s_s: np.ndarray, codes_s: np.ndarray, num_groups: int) -> np.ndarray:
    """[N] score-sorted labels, sort keys and group codes -> [G] AUC per group (nan if one class)."""
    small = np.int8 if num_groups <= 127 else np.int16  # numpy's radix sort: one byte, one counting pass
    g_order = np.argsort(codes_s.astype(small), kind="stable")  # counting sort: stays sorted in a group
    y_g, s_g = y_s[g_order], s_s[g_order]
    ends = np.cumsum(np.bincount(codes_s, minlength=num_groups))
    out = np.full(num_groups, np.nan)
    for g, (lo, hi) in enumerate(zip(np.r_[0, ends[:-1]], ends)):
        if hi > lo:
            out[g] = auc_sorted(y_g[lo:hi], s_g[lo:hi])
    return out


def _ece(table: np.ndarray) -> np.ndarray:
    """[3, ..., n_bins] (count, sum p, sum y) -> [...] ECE = sum_b |sum p_b - sum y_b| / count."""
    return np.abs(table[1] - table[2]).sum(-1) / table[0].sum(-1)


def _row(scope: str, auc: float, nll_sum: float, table: np.ndarray) -> dict:
    n = int(table[0].sum())
    return {"scope": scope, "auc": float(auc), "log_loss": float(nll_sum / n), "ece": float(_ece(table)), "n": n}


def additive_sums(p: np.ndarray, y: np.ndarray, group: np.ndarray, d: int, k: int,
                  n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """[N] predictions, labels and groups (dataset * K + position) -> the additive half of a score
    table: summed NLL [D, K] and ECE bins [3, D, K, n_bins] (count, sum p, sum y)."""
    # NLL = -log of the probability given to the observed label, clipped as sklearn does.
    nll = -np.log(np.clip(np.where(y > 0, p, 1.0 - p), _EPS, 1 - _EPS))  # [N]
    nll_g = np.bincount(group, weights=nll, minlength=d * k).reshape(d, k)
    key = group * n_bins + np.minimum((p * n_bins).astype(np.int64), n_bins - 1)  # [N] (group, bin)
    table = np.stack([np.bincount(key, weights=w, minlength=d * k * n_bins) for w in (None, p, y)])
    return nll_g, table.astype(np.float64).reshape(3, d, k, n_bins)


class ScoreLayout:
    """The prediction-independent half of a score table over [N] observed slots.

    y: [N] float64 labels in {0, 1}; pos: [N] int positions; ds: [N] int dataset codes or None.
    """

    def __init__(self, y: np.ndarray, pos: np.ndarray, ds: np.ndarray | None = None,
                 dataset_names: list[str] | None = None, n_bins: int = 10):
        self.y, self.n_bins = y, n_bins
        self.k = int(pos.max()) + 1
        self.names = dataset_names or [""]
        self.d = 1 if ds is None else len(self.names)
        self.group = pos.astype(np.int64) if ds is None else ds.astype(np.int64) * self.k + pos  # [N]
        self.bits = 1 + max(1, (self.d * self.k - 1).bit_length())
        if self.bits > MAX_KEY_BITS:
            raise DataError(f"too many (dataset, position) groups to score: {self.d} x {self.k}")
        self.base = (self.group.astype(np.uint64) << np.uint64(1)) | y.astype(np.uint64)  # [N]

    def _sorted(self, p: np.ndarray):
        """-> (labels, tie keys, group codes), each [N] in ascending order of p."""
        mask = np.uint64((1 << self.bits) - 1)
        bits = (p + 0.0).view(np.uint64)  # + 0.0 turns -0.0 into +0.0
        key = pl.Series((bits & ~mask) | self.base).sort().to_numpy()  # [N] radix sort
        return (key & np.uint64(1)).astype(np.float64), key >> np.uint64(self.bits), \
            ((key >> np.uint64(1)) & (mask >> np.uint64(1))).astype(np.int64)

    def score(self, p: np.ndarray) -> list[dict]:
        """[N] predictions in [0, 1] -> rows {scope, auc, log_loss, ece, n}."""
        y, k, d, nb = self.y, self.k, self.d, self.n_bins
        y_s, s_s, g_s = self._sorted(np.ascontiguousarray(p, dtype=np.float64))
        nll_g, table = additive_sums(p, y, self.group, d, k, nb)
        pos_s = g_s % k
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UndefinedMetricWarning)
            rest = pos_s > 0
            aucs_all = auc_sorted(y_s, s_s)
            aucs = {"all": aucs_all,
                    "all_but_first": auc_sorted(y_s[rest], s_s[rest]) if rest.any() else np.nan,
                    "position": _grouped_auc(y_s, s_s, pos_s, k),
                    "dataset": None if d == 1 and self.names == [""] else  # one dataset: its AUC is "all"'s
                    [aucs_all] if d == 1 else _grouped_auc(y_s, s_s, g_s // k, d)}
        return scope_rows(nll_g, table, self.names, aucs)


def scope_rows(nll_g: np.ndarray, table: np.ndarray, names: list[str], aucs: dict, extra=None) -> list[dict]:
    """Rows of every scope from additive per-group sums and the scopes' AUCs.

    nll_g: [D, K] summed NLL; table: [3, D, K, n_bins] (count, sum p, sum y); aucs: {"all": float,
    "all_but_first": float, "position": [K], "dataset": [D]}; extra(scope) -> more keys of a row.
    """
    d, k = nll_g.shape

    def row(scope, auc, nll_sum, t):
        return _row(scope, auc, nll_sum, t) | ({} if extra is None else extra(scope))

    rows = [row("all", aucs["all"], nll_g.sum(), table.sum((1, 2)))]
    if k > 1 and table[0, :, 1:].sum() > 0:
        rows.append(row("all_but_first", aucs["all_but_first"], nll_g[:, 1:].sum(), table[:, :, 1:].sum((1, 2))))
    rows += [row(f"position={i}", aucs["position"][i], nll_g[:, i].sum(), table[:, :, i].sum(1))
             for i in range(k) if table[0, :, i].sum() > 0]
    if d > 1 or names != [""]:
        rows += [row(f"dataset={names[j]}", aucs["dataset"][j], nll_g[j].sum(), table[:, j].sum(1))
                 for j in range(d) if table[0, j].sum() > 0]
    return rows


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
    ds = None if dataset_codes is None else np.asarray(dataset_codes, dtype=np.int64)
    if ds is not None and (ds.shape != y.shape or ds.min() < 0 or ds.max() >= len(dataset_names)):
        raise DataError(f"dataset_codes must be [N] indices into dataset_names, got shape {ds.shape}")
    return ScoreLayout(y, pos, ds, dataset_names, n_bins).score(p)


__all__ = ["ScoreLayout", "additive_sums", "scope_rows", "score_table"]
