"""The adaptive budget (avkit/scheduling/budget.py) for many simulated steps at once, in numpy.

Same rule as the live policy, vectorized over groups (one group = one sim step):
  survival s[r, j] = prod_{i<=j} c[r, i]; rank a group's valid slots by (s desc, row, position);
  b*_g = argmax_b (N_s + sum of the top-b survivals) / (fixed_ms_g + verify_ms(T_g + b)), ties -> smallest;
  row r verifies the number of its slots ranked < b*.
One lexsort over all slots, cumulative sums restarted at group starts, and reduceat for the argmax.
`sizing` (confidences, drafted) sizes b* from other inputs than the ones allocated, as the live policy
does for losslessness (each request's position-0 feature predicted at every position, K nominal drafts;
budget.py): b*_g comes from the sizing slots, capped at the group's live slots, and the top-b*_g live
slots are verified.
"""

from __future__ import annotations

import numpy as np


def grouped_survival(conf: np.ndarray, drafted: np.ndarray) -> np.ndarray:
    """[S, K] confidences, [S] drafted -> [S, K] survival, 0 past `drafted`."""
    k = conf.shape[1]
    valid = np.arange(k)[None, :] < drafted[:, None]
    c = np.where(valid, np.clip(np.nan_to_num(conf, nan=0.0), 0.0, 1.0), 0.0)
    return np.cumprod(c, axis=1)


def _ranked(group: np.ndarray, conf: np.ndarray, drafted: np.ndarray):
    """Valid slots sorted by (group, survival desc, row, position).

    Returns row [M], group [M], survival [M], starts [G'] (first slot of each group that has slots),
    seg [M] (segment of each slot) and rank [M] (0-based rank within its group).
    """
    k = conf.shape[1]
    surv = grouped_survival(conf, drafted)  # [S, K]
    row, pos = np.nonzero(np.arange(k)[None, :] < drafted[:, None])  # [M] valid slots, row-major
    g, s = group[row], surv[row, pos]
    order = np.lexsort((pos, row, -s, g))
    row, g, s = row[order], g[order], s[order]
    m = row.size
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if m else np.zeros(0, np.int64)
    seg = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, m]))  # [M]
    return row, g, s, starts, seg, np.arange(m) - starts[seg] if m else np.zeros(0, np.int64)


def _best_budget(group, conf, drafted, num_sampling, num_scheduled, fixed_ms, verify_ms) -> np.ndarray:
    """[G] b*_g for every group (0 for groups without slots)."""
    _, g, s, starts, seg, rank = _ranked(group, conf, drafted)
    budget = np.zeros(num_sampling.size, dtype=np.int64)
    if s.size == 0:
        return budget
    gid = g[starts]  # [G'] groups that have slots
    csum = np.cumsum(s)
    top_b = csum - (csum[starts] - s[starts])[seg]  # [M] sum of survivals of ranks 0..rank
    b = rank + 1  # [M] budget if this slot is the last one verified
    rate = (num_sampling[g] + top_b) / (fixed_ms[g] + verify_ms(num_scheduled[g] + b))  # [M]
    best = np.maximum.reduceat(rate, starts)  # [G']
    first_best = np.minimum.reduceat(np.where(rate == best[seg], b, s.size + 1), starts)  # ties -> smallest b
    rate0 = num_sampling[gid] / (fixed_ms[gid] + verify_ms(num_scheduled[gid]))  # b = 0
    budget[gid] = np.where(rate0 >= best, 0, first_best)
    return budget


def grouped_budget(group: np.ndarray, conf: np.ndarray, drafted: np.ndarray, *,
                   num_sampling: np.ndarray, num_scheduled: np.ndarray, fixed_ms: np.ndarray,
                   verify_ms, sizing: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Verify counts [S] for rows grouped by `group` ([S] ints in [0, G), sorted ascending).

    num_sampling, num_scheduled, fixed_ms: [G] per group; verify_ms maps target tokens to ms.
    sizing: optional (confidences [S, K], drafted [S]) that size b* (see the module note).
    """
    num_sampling, num_scheduled = np.asarray(num_sampling), np.asarray(num_scheduled)
    fixed_ms = np.broadcast_to(np.asarray(fixed_ms, dtype=np.float64), num_sampling.shape)
    size_conf, size_drafted = sizing if sizing is not None else (conf, drafted)
    budget = _best_budget(group, size_conf, size_drafted, num_sampling, num_scheduled, fixed_ms, verify_ms)
    row, g, _, _, _, rank = _ranked(group, conf, drafted)
    winners = rank < budget[g]  # [M]; b* above the live slots verifies them all
    return np.bincount(row[winners], minlength=conf.shape[0]).astype(np.int64)
