"""Probabilistic metrics: log-loss and expected calibration error (lower is better), and the one
validator of every metric's inputs.

Glossary:
  labels   y_n in {0, 1}                                                   [N]
  probs    predicted acceptance probabilities p_n in [0, 1]               [N]
  weights  optional sample weights w_n >= 0                               [N]
log_loss = sum_n w_n * -(y_n log p_n + (1 - y_n) log(1 - p_n)) / sum_n w_n, with p clipped to
[eps, 1 - eps] (eps = float64 machine epsilon), exactly as sklearn's `log_loss`.
ECE = sum_b (W_b / W) |mean_b(p) - mean_b(y)| over `n_bins` equal-width bins of p; bin b holds
p in [b/n_bins, (b+1)/n_bins), the last bin also holds p = 1.
"""

from __future__ import annotations

import numpy as np

from avkit.errors import DataError

EPS = np.finfo(np.float64).eps


class UndefinedMetricWarning(UserWarning):
    """The metric is undefined on this input (e.g. AUC with one class); nan is returned."""


def as_1d(name: str, x) -> np.ndarray:
    """Array-like (a tensor too) as a 1-D float64 array; DataError on empty or NaN/inf input."""
    a = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
    if a.ndim != 1:
        a = a.reshape(-1) if a.ndim == 0 or a.size == a.shape[0] else a
    if a.ndim != 1:
        raise DataError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size == 0:
        raise DataError(f"{name} is empty")
    a = a.astype(np.float64, copy=False)
    if not np.all(np.isfinite(a)):
        i = int(np.flatnonzero(~np.isfinite(a))[0])
        raise DataError(f"{name} contains non-finite values: {name}[{i}] = {a[i]}")
    return a


def check_binary_inputs(labels, values, sample_weight=None, *, name: str, probabilities: bool):
    """The one validator of binary metric inputs (messages name the argument and show the bad value):
    -> (labels [N] float64 in {0,1}, values [N] float64, weights [N] float64 or None)."""
    y = as_1d("labels", labels)
    bad = (y != 0) & (y != 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"labels must contain only 0 and 1, got labels[{i}] = {y[i]}")
    v = as_1d(name, values)
    if probabilities and (v.min() < 0 or v.max() > 1):
        raise DataError(f"{name} must be probabilities in [0, 1], got {v.min() if v.min() < 0 else v.max()}")
    arrays = {"labels": y, name: v}
    w = None
    if sample_weight is not None:
        w = arrays["sample_weight"] = as_1d("sample_weight", sample_weight)
        if w.min() < 0:
            raise DataError(f"sample_weight must be >= 0, got {w.min()}")
    lens = {k: len(a) for k, a in arrays.items()}
    if len(set(lens.values())) > 1:
        raise DataError(f"inconsistent lengths: {lens}")
    if w is not None and w.sum() <= 0:
        raise DataError(f"sample_weight must have a positive sum, got {w.sum()}")
    return y, v, w


def log_loss(labels, probs, sample_weight=None) -> float:
    """Mean negative log-likelihood of binary labels under predicted probabilities.

    Examples
    --------
    >>> round(log_loss([1, 0], [0.8, 0.4]), 6)
    0.366985
    """
    y, p, w = check_binary_inputs(labels, probs, sample_weight, name="probs", probabilities=True)
    p = np.clip(p, EPS, 1 - EPS)
    nll = -(y * np.log(p) + (1.0 - y) * np.log1p(-p))  # [N]
    return float(nll.mean()) if w is None else float(np.dot(w, nll) / w.sum())


def ece(labels, probs, n_bins: int = 10, sample_weight=None) -> float:
    """Expected calibration error over `n_bins` equal-width probability bins.

    Examples
    --------
    >>> round(ece([1, 0, 1, 1], [0.9, 0.1, 0.8, 0.6]), 6)
    0.2
    """
    y, p, w = check_binary_inputs(labels, probs, sample_weight, name="probs", probabilities=True)
    return float(ece_from_bins(bin_sums(p, y, check_n_bins(n_bins), w)))


def check_n_bins(n_bins) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise DataError(f"n_bins must be a positive integer, got {n_bins!r}")
    return int(n_bins)


def additive_sums(p: np.ndarray, y: np.ndarray, group: np.ndarray, d: int, k: int, n_bins: int,
                  w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """[N] predictions, labels, groups (dataset * K + position) and weights (None: 1) -> the additive half
    of a score table: summed NLL [D, K] and ECE bins [3, D, K, n_bins] (weight, sum w p, sum w y). The one
    binning rule of in-memory, binned (out-of-core), bootstrap, debiased and live (vLLM health) scores."""
    # NLL = -log of the probability given to the observed label, clipped as sklearn does.
    nll = -np.log(np.clip(np.where(y > 0, p, 1.0 - p), EPS, 1 - EPS))  # [N]
    nll_g = np.bincount(group, weights=nll, minlength=d * k).reshape(d, k)
    key = group * n_bins + np.minimum((p * n_bins).astype(np.int64), n_bins - 1)  # [N] (group, bin)
    weights = (None, p, y) if w is None else (w, w * p, w * y)
    table = np.stack([np.bincount(key, weights=x, minlength=d * k * n_bins) for x in weights])
    return nll_g, table.astype(np.float64).reshape(3, d, k, n_bins)


def bin_sums(p: np.ndarray, y: np.ndarray, n_bins: int, w: np.ndarray | None = None) -> np.ndarray:
    """[N] predictions, labels (and weights) of one group -> [3, n_bins] its ECE bins (`additive_sums`)."""
    return additive_sums(p, y, np.zeros(len(p), np.int64), 1, 1, n_bins, w)[1][:, 0, 0]


def ece_from_bins(table: np.ndarray) -> np.ndarray:
    """[3, ..., n_bins] per-bin sums (weight, sum p, sum y) -> [...] ECE = sum_b |sum p_b - sum y_b| / weight
    (= sum_b W_b/W |mean_b p - mean_b y|): the one ECE of in-memory, binned, bootstrap and live scores."""
    return np.abs(table[1] - table[2]).sum(-1) / table[0].sum(-1)
