"""Score tables from additive sums: what out-of-core and distributed fits compute per shard.

A fit that never holds every prediction at once scores a feature from sums that add across
chunks, shards and machines (every array below is summed, nothing else is kept):
  nll    [D, K]              summed negative log-likelihood per (dataset, position) group
  table  [3, D, K, n_bins]   ECE bins per group: count, sum p, sum y (metrics/table.py)
  hist   [D, K, 2, B]        rank histogram per group: negatives / positives in each of B
                             equal-width bins of z = logit(p) over [lo, hi] (z outside is clipped)
log-loss and ECE are then exactly those of the in-memory table (up to summation order).
AUC from the histogram counts a positive/negative pair in different bins exactly and a pair in
one bin as a tie (1/2):
  AUC_hist = sum_b pos_b (neg_{<b} + neg_b / 2) / (P N)
A pair in one bin is a win, a loss or a tie of the exact AUC, each 1/2 away from the tie it was
counted as, so
  |AUC_hist - AUC| <= bound = sum_b pos_b neg_b / (2 P N)
which the same counts give; every row carries it as `auc_bound`. With B = 2^16 bins over the
logit range of the predictions, smooth score distributions give bounds of ~1e-5 (tested below
1e-4). Predictions that tie exactly (e.g. a feature clamped at its limit) fall in one bin and
count in the bound although they cost no error: the bound is conservative there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

import numpy as np

from avkit.metrics.table import additive_sums, scope_rows

DEFAULT_AUC_BINS = 1 << 16


def auc_from_histogram(hist: np.ndarray) -> tuple[float, float]:
    """[2, B] counts (negatives, positives) per ascending rank bin -> (AUC, error bound); nan if one class."""
    neg, pos = hist[0].astype(np.float64), hist[1].astype(np.float64)  # [B]
    total_pos, total_neg = pos.sum(), neg.sum()
    if total_pos == 0 or total_neg == 0:
        return float("nan"), float("nan")
    below = np.cumsum(neg) - neg  # [B] negatives in lower bins
    pairs = total_pos * total_neg
    return float(np.dot(pos, below + 0.5 * neg) / pairs), float(np.dot(pos, neg) / (2.0 * pairs))


@dataclass
class BinnedScores:
    """Additive score sums of one feature's predictions; `+=` merges shards, `rows` scores them."""

    lo: float  # logit range of the rank bins
    hi: float
    nll: np.ndarray  # [D, K] float64
    table: np.ndarray  # [3, D, K, n_bins] float64
    hist: np.ndarray  # [D, K, 2, B] int64

    @classmethod
    def zeros(cls, d: int, k: int, n_bins: int, lo: float, hi: float,
              auc_bins: int = DEFAULT_AUC_BINS) -> BinnedScores:
        hi = hi if hi > lo else lo + 1.0  # one distinct value: any positive width
        return cls(float(lo), float(hi), np.zeros((d, k)), np.zeros((3, d, k, n_bins)),
                   np.zeros((d, k, 2, auc_bins), dtype=np.int64))

    def add(self, p: np.ndarray, y: np.ndarray, group: np.ndarray) -> None:
        """[N] predictions in [0, 1], labels in {0, 1}, groups (dataset * K + position)."""
        d, k, nb = self.table.shape[1], self.table.shape[2], self.hist.shape[-1]
        nll, table = additive_sums(p, y, group, d, k, self.table.shape[-1])
        self.nll += nll
        self.table += table
        with np.errstate(divide="ignore"):
            z = np.log(p) - np.log1p(-p)  # [N] logit, monotone in p (+-inf at 0 and 1)
        scale = nb / (self.hi - self.lo)
        b = np.clip((z - self.lo) * scale, 0, nb - 1).astype(np.int64)  # [N] rank bin
        key = (group * 2 + y.astype(np.int64)) * nb + b  # [N] (group, label, bin)
        self.hist += np.bincount(key, minlength=d * k * 2 * nb).reshape(self.hist.shape)

    def __iadd__(self, other: BinnedScores) -> Self:
        if (other.lo, other.hi, other.hist.shape) != (self.lo, self.hi, self.hist.shape):
            raise ValueError("BinnedScores: cannot add sums over different bins")
        self.nll += other.nll
        self.table += other.table
        self.hist += other.hist
        return self

    def rows(self, names: list[str]) -> list[dict]:
        """Rows {scope, auc, log_loss, ece, n, auc_bound} for the standard scopes (metrics/table.py)."""
        h = self.hist
        scopes = {"all": h.sum((0, 1)), "all_but_first": h[:, 1:].sum((0, 1))}
        scopes |= {f"position={i}": h[:, i].sum(0) for i in range(h.shape[1])}
        scopes |= {f"dataset={n}": h[j].sum(0) for j, n in enumerate(names)}
        res = {scope: auc_from_histogram(x) for scope, x in scopes.items()}
        aucs = {"all": res["all"][0], "all_but_first": res["all_but_first"][0],
                "position": [res[f"position={i}"][0] for i in range(h.shape[1])],
                "dataset": [res[f"dataset={n}"][0] for n in names]}
        return scope_rows(self.nll, self.table, names, aucs, extra=lambda s: {"auc_bound": res[s][1]})


__all__ = ["DEFAULT_AUC_BINS", "BinnedScores", "auc_from_histogram"]
