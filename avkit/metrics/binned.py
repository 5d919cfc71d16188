"""Score tables from additive sums (per chunk, shard, machine): how out-of-core fits score (docs/fleet.md).

  nll    [D, K]              summed negative log-likelihood per (dataset, position) group
  table  [3, D, K, n_bins]   ECE bins per group (metrics/calibration.py `additive_sums`)
  hist   [D, K, 2, B]        negatives / positives per rank bin of z = logit(p), split at `edges`
                             [B - 1] (`quantile_edges` of a sample: each bin ~1/B of the slots)
  ref, eq [D, K, B], [D, K, 2, B]  one value z of each bin and the negatives / positives equal to it
log-loss and ECE are those of the in-memory table (up to summation order). A pair in different bins
is ranked exactly, a pair in one bin counted a tie, except pairs of equal predictions (true ties):
  AUC_hist = sum_b pos_b (neg_{<b} + neg_b / 2) / (P N)
  |AUC_hist - AUC| <= auc_bound = sum_b (pos_b neg_b - eqpos_b eqneg_b) / (2 P N)
Sums with different `ref` in a bin keep the larger tied block (the bound stays valid). With B = 2^16
bins of equal mass the bound is about 1/(4B) ~ 4e-6 whatever the distribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

import numpy as np

from avkit.metrics.calibration import additive_sums
from avkit.metrics.table import scope_rows, scopes

DEFAULT_AUC_BINS = 1 << 16


def auc_from_histogram(hist: np.ndarray, eq: np.ndarray | None = None) -> tuple[float, float]:
    """[2, B] counts (negatives, positives) per ascending rank bin and [2, B] counts of each bin's
    tied block (None: no ties known) -> (AUC, error bound); nan if one class."""
    neg, pos = hist[0].astype(np.float64), hist[1].astype(np.float64)  # [B]
    total_pos, total_neg = pos.sum(), neg.sum()
    if total_pos == 0 or total_neg == 0:
        return float("nan"), float("nan")
    below = np.cumsum(neg) - neg  # [B] negatives in lower bins
    pairs = total_pos * total_neg
    within = pos * neg  # [B] pairs in one bin ...
    if eq is not None:
        within = within - eq[0].astype(np.float64) * eq[1]  # ... less the true ties among them
    return float(np.dot(pos, below + 0.5 * neg) / pairs), float(within.sum() / (2.0 * pairs))


def logit(p: np.ndarray) -> np.ndarray:
    """[N] probabilities -> [N] log-odds, monotone in p (+-inf at 1 and 0)."""
    with np.errstate(divide="ignore"):
        return np.log(p) - np.log1p(-p)


def quantile_edges(z: np.ndarray, bins: int = DEFAULT_AUC_BINS) -> np.ndarray:
    """[S] sample of logits -> ascending distinct edges of (at most) `bins` bins of equal sample mass."""
    z = np.sort(np.clip(z, -1e300, 1e300))  # +-inf (p of exactly 0 or 1) sort as the extremes
    if z.size == 0:
        return z
    q = np.arange(1, bins) / bins  # [bins - 1] interior quantiles (np.quantile partitions per q: slow)
    return np.unique(z[np.clip(np.ceil(q * z.size).astype(np.int64) - 1, 0, z.size - 1)])


@dataclass
class BinnedScores:
    """Additive score sums of one feature's predictions; `+=` merges shards, `rows` scores them."""

    edges: np.ndarray  # [B - 1] ascending logit edges of the rank bins
    nll: np.ndarray  # [D, K] float64
    table: np.ndarray  # [3, D, K, n_bins] float64
    hist: np.ndarray  # [D, K, 2, B] int64 (int32 in one shard's sums)
    ref: np.ndarray  # [D, K, B] float64: one value z of the bin (nan: empty)
    eq: np.ndarray  # [D, K, 2, B] int64 (int32 likewise): negatives / positives whose z equals `ref`

    @classmethod
    def zeros(cls, d: int, k: int, n_bins: int, edges: np.ndarray, counts=np.int64) -> BinnedScores:
        """Empty sums; `counts` = np.int32 for the sums of fewer than 2^31 slots (one shard's: 40% less
        memory in flight; the total they are added into widens to int64)."""
        b = len(edges) + 1
        return cls(np.asarray(edges, dtype=np.float64), np.zeros((d, k)), np.zeros((3, d, k, n_bins)),
                   np.zeros((d, k, 2, b), dtype=counts), np.full((d, k, b), np.nan),
                   np.zeros((d, k, 2, b), dtype=counts))

    def add(self, p: np.ndarray, y: np.ndarray, group: np.ndarray) -> None:
        """[N] predictions in [0, 1], labels in {0, 1}, groups (dataset * K + position)."""
        d, k, nb = self.table.shape[1], self.table.shape[2], self.hist.shape[-1]
        nll, table = additive_sums(p, y, group, d, k, self.table.shape[-1])
        self.nll += nll
        self.table += table
        z = logit(p)  # [N]
        b = np.searchsorted(self.edges, z, side="right")  # [N] rank bin
        key = (group * 2 + y.astype(np.int64)) * nb + b  # [N] (group, label, bin)
        self.hist += np.bincount(key, minlength=d * k * 2 * nb).reshape(self.hist.shape)
        cell = group * nb + b  # [N] (group, bin)
        ref = self.ref.reshape(-1)  # view
        empty = np.isnan(ref[cell])
        ref[cell[empty]] = z[empty]  # one of the values of each newly filled bin
        same = z == ref[cell]  # [N]
        self.eq += np.bincount(key[same], minlength=d * k * 2 * nb).reshape(self.eq.shape)

    def __iadd__(self, other: BinnedScores) -> Self:
        if not np.array_equal(other.edges, self.edges):
            raise ValueError("BinnedScores: cannot add sums over different bins")
        self.hist = self.hist.astype(np.int64, copy=False)  # a total of several shards counts in int64
        self.nll += other.nll
        self.table += other.table
        self.hist += other.hist
        mine, theirs = self.eq.sum(2), other.eq.sum(2)  # [D, K, B] tied block sizes
        same = self.ref == other.ref
        take = np.isnan(self.ref) | (~same & ~np.isnan(other.ref) & (theirs > mine))  # keep the larger block
        self.eq = np.where(same[:, :, None], self.eq.astype(np.int64) + other.eq,
                           np.where(take[:, :, None], other.eq, self.eq)).astype(np.int64, copy=False)
        self.ref = np.where(take, other.ref, self.ref)
        return self

    def _scope(self, groups: tuple) -> tuple[float, float]:
        """AUC and bound of the union of the (dataset, position) groups selected by `groups` (an index)."""
        b = self.hist.shape[-1]
        hist = self.hist[groups].reshape(-1, 2, b)  # [G, 2, B]
        ref, eq = self.ref[groups].reshape(-1, b), self.eq[groups].reshape(-1, 2, b)  # [G, B], [G, 2, B]
        top = np.take_along_axis(ref, eq.sum(1).argmax(0)[None], 0)  # [1, B] ref of the largest block
        eq = (eq * (ref == top)[:, None]).sum(0)  # [2, B] the blocks tied at that value
        return auc_from_histogram(hist.sum(0), eq)

    def rows(self, names: list[str]) -> list[dict]:
        """Rows {scope, auc, log_loss, ece, n, auc_bound} for the standard scopes (metrics/table.py)."""
        res = {scope: self._scope(groups) for scope, groups in scopes(*self.nll.shape, names)}
        return scope_rows(self.nll, self.table, names, {s: r[0] for s, r in res.items()},
                          {s: {"auc_bound": r[1]} for s, r in res.items()})
