"""Score tables: every metric over the standard scopes of a trace (docs/estimator.md).

Scopes: all; all_but_first (positions >= 1: position 0 is easy and dominates the pooled AUC); position=i;
dataset=NAME. `ScoreLayout` holds what does not depend on the predictions (labels, groups = dataset x
position) and is built once; scoring one feature then costs one sort plus O(N) passes:
  AUC      one radix sort of uint64 keys: the prediction's float64 bits (a non-negative double orders
           like its bit pattern) with the low `bits` mantissa bits replaced by (group, label), so the
           sorted keys carry labels and groups along. Every scope's AUC comes from that one order
           (`_family_auc`). Predictions closer than 2^-(52 - bits) relative (bits <= 12) count as a
           tie (1/2); the public `auc` is exact.
  log-loss, ECE   per-(group, bin) additive sums; a union of groups sums its rows of the table
"""

from __future__ import annotations

import numpy as np
import polars as pl

from avkit.errors import DataError
from avkit.metrics.calibration import additive_sums, check_binary_inputs, ece_from_bins
from avkit.metrics.ranking import tie_correction

MAX_KEY_BITS = 12  # label + group bits packed below the prediction's bits


def _family_auc(codes: np.ndarray | None, y: np.ndarray, ties, num_codes: int) -> np.ndarray:
    """[C] AUC of each code's rows from one sort: codes [N] small ints (None: one code), y [N] int8 labels,
    in ascending order of the prediction; ties: (rows inside tie blocks [T], their block ids [T]) or None.
    A positive of code c at place j among c's rows outranks j - (positives of c before it) negatives, so
    the win count is sum_pos j - P (P - 1) / 2 (a stable counting sort by code gives each j); ties are
    corrected on the tied rows only."""
    codes = np.zeros(y.size, np.int8) if codes is None else codes
    order = np.argsort(codes, kind="stable")  # counting sort of small ints
    n = np.bincount(codes, minlength=num_codes)  # [C] rows per code
    start = (np.cumsum(n) - n).astype(np.float64)  # [C] first place of each code
    hit = np.flatnonzero(y[order])  # [P] places of the positives in the code-grouped layout
    code_of = np.repeat(np.arange(num_codes), n)[hit]  # [P]
    pos = np.bincount(code_of, minlength=num_codes).astype(np.float64)
    wins = np.bincount(code_of, weights=hit, minlength=num_codes) - pos * start - pos * (pos - 1) / 2  # [C]
    if ties is not None:
        yt = y[ties[0]].astype(np.float64)  # [T]
        wins += tie_correction(ties[1], yt, 1.0 - yt, codes[ties[0]], num_codes)
    neg = n - pos
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((pos > 0) & (neg > 0), wins / (pos * neg), np.nan)


class ScoreLayout:
    """The prediction-independent half of a score table: y [N] float64 labels in {0, 1}, pos [N] int
    positions, ds [N] int dataset codes or None."""

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
        self.small = np.int8 if max(self.d, self.k) <= 127 else np.int16  # codes of the counting sorts
        groups = np.arange(self.d * self.k)
        self.pos_of, self.ds_of = (groups % self.k).astype(self.small), (groups // self.k).astype(self.small)

    def _sorted(self, p: np.ndarray):
        """-> (labels [N] int8, group codes [N], tie blocks), in ascending order of p; the tie blocks
        are (rows inside a run of equal predictions [T], run id of each [T]) or None."""
        mask = np.uint64((1 << self.bits) - 1)
        bits = (p + 0.0).view(np.uint64)  # + 0.0 turns -0.0 into +0.0
        key = pl.Series((bits & ~mask) | self.base).sort().to_numpy()  # [N] radix sort
        y = (key & np.uint64(1)).astype(np.int8)
        group = (key >> np.uint64(1)) & (mask >> np.uint64(1))
        tied = (key[1:] ^ key[:-1]) <= mask  # [N-1] row i+1 has row i's prediction
        ties = None
        if tied.any():
            rows = np.flatnonzero(np.r_[tied, False] | np.r_[False, tied])  # [T]
            ties = (rows, np.cumsum(~np.r_[False, tied][rows]))  # a run opens where row i+1 != row i
        return y, group.astype(np.int16), ties  # (groups < 2^(MAX_KEY_BITS - 1))

    def score(self, p: np.ndarray) -> list[dict]:
        """[N] predictions in [0, 1] -> rows {scope, auc, log_loss, ece, n}."""
        y, k, d, nb = self.y, self.k, self.d, self.n_bins
        y_s, g_s, ties = self._sorted(np.ascontiguousarray(p, dtype=np.float64))
        nll_g, table = additive_sums(p, y, self.group, d, k, nb)
        pos_s = self.pos_of[g_s]  # [N] position of each sorted row
        aucs = {"all": float(_family_auc(None, y_s, ties, 1)[0])}
        if k > 1:
            aucs["all_but_first"] = float(_family_auc((pos_s > 0).view(np.int8), y_s, ties, 2)[1])
        aucs |= {f"position={i}": a for i, a in enumerate(_family_auc(pos_s, y_s, ties, k))}
        ds_aucs = _family_auc(self.ds_of[g_s], y_s, ties, d) if d > 1 else [aucs["all"]]  # one: "all"'s
        aucs |= {f"dataset={n}": a for n, a in zip(self.names, ds_aucs)}
        return scope_rows(nll_g, table, self.names, aucs)


def scopes(d: int, k: int, names: list[str]) -> list[tuple[str, tuple]]:
    """The standard scopes (module note) of D datasets `names` and K positions: (scope, index of its
    (dataset, position) groups into a [D, K] array); no dataset scopes for one unnamed dataset."""
    out = [("all", np.s_[:, :])] + [("all_but_first", np.s_[:, 1:])] * (k > 1)
    out += [(f"position={i}", np.s_[:, i:i + 1]) for i in range(k)]
    return out + [(f"dataset={n}", np.s_[j:j + 1, :]) for j, n in enumerate(names)] * (d > 1 or names != [""])


def scope_rows(nll_g: np.ndarray, table: np.ndarray, names: list[str], aucs: dict[str, float],
               extra: dict[str, dict] | None = None) -> list[dict]:
    """Rows {scope, auc, log_loss, ece, n} (and `extra[scope]`'s keys) of every non-empty scope, from
    additive per-group sums: nll_g [D, K] summed NLL, table [3, D, K, n_bins] (count, sum p, sum y);
    aucs: scope -> its AUC."""
    rows = []
    for scope, groups in scopes(*nll_g.shape, names):
        t = table[(slice(None), *groups)].sum((1, 2))  # [3, n_bins]
        n = int(t[0].sum())
        if n > 0:
            nll = float(nll_g[groups].sum() / n)
            rows.append({"scope": scope, "auc": float(aucs[scope]), "log_loss": nll, "ece": float(ece_from_bins(t)),
                         "n": n} | (extra or {}).get(scope, {}))
    return rows


def score_table(labels, probs, positions, dataset_codes=None, dataset_names=None,
                n_bins: int = 10) -> list[dict]:
    """Rows {scope, auc, log_loss, ece, n} of [N] labels in {0, 1}, predictions in [0, 1], positions and
    optional dataset codes (into `dataset_names`) for the standard scopes; AUC is nan for one class.

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
