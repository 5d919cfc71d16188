"""The adaptive budget (avkit/scheduling/budget.py) for many simulated steps at once, in numpy.

Same rule as the live policy, vectorized over groups (one group = one sim step):
  survival s[r, j] = prod_{i<=j} c[r, i]; rank a group's valid slots by (s desc, row, position);
  b*_g = argmax_b (N_s + sum of the top-b survivals) / (fixed_ms_g + verify_ms(T_g + b)), ties -> smallest;
  row r verifies the number of its slots ranked < b*.
One lexsort over all slots, cumulative sums restarted at group starts, and reduceat for the argmax.
Known gap: the live policy sizes b* from draw-independent inputs (each request's position-0 feature,
see budget.py on losslessness) and allocates from live survivals; this replay sizes b* from the live
survivals, so its adaptive rows are a slightly optimistic bound on the live policy.
"""

from __future__ import annotations

import numpy as np


def grouped_survival(conf: np.ndarray, drafted: np.ndarray) -> np.ndarray:
    """[S, K] confidences, [S] drafted -> [S, K] survival, 0 past `drafted`."""
    k = conf.shape[1]
    valid = np.arange(k)[None, :] < drafted[:, None]
    c = np.where(valid, np.clip(np.nan_to_num(conf, nan=0.0), 0.0, 1.0), 0.0)
    return np.cumprod(c, axis=1)


def grouped_budget(group: np.ndarray, conf: np.ndarray, drafted: np.ndarray, *,
                   num_sampling: np.ndarray, num_scheduled: np.ndarray, fixed_ms: np.ndarray,
                   verify_ms) -> np.ndarray:
    """Verify counts [S] for rows grouped by `group` ([S] ints in [0, G), sorted ascending).

    num_sampling, num_scheduled, fixed_ms: [G] per group; verify_ms maps target tokens to ms.
    """
    s_rows, k = conf.shape
    surv = grouped_survival(conf, drafted)  # [S, K]
    valid = np.arange(k)[None, :] < drafted[:, None]  # [S, K]
    row, pos = np.nonzero(valid)  # [M] valid slots, row-major
    g, s = group[row], surv[row, pos]
    order = np.lexsort((pos, row, -s, g))  # by group, then survival desc, then (row, position)
    row, g, s = row[order], g[order], s[order]
    m = row.size
    num_verify = np.zeros(s_rows, dtype=np.int64)
    if m == 0:
        return num_verify
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])  # [G'] first slot of each group with slots
    gid = g[starts]  # [G'] which groups those are
    seg = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, m]))  # [M] segment of each slot
    rank = np.arange(m) - starts[seg]  # [M] 0-based rank within the group
    csum = np.cumsum(s)
    top_b = csum - (csum[starts] - s[starts])[seg]  # [M] sum of survivals of ranks 0..rank
    b = rank + 1  # [M] budget if this slot is the last one verified
    rate = (num_sampling[g] + top_b) / (fixed_ms[g] + verify_ms(num_scheduled[g] + b))  # [M]
    best = np.maximum.reduceat(rate, starts)  # [G']
    first_best = np.minimum.reduceat(np.where(rate == best[seg], b, m + 1), starts)  # ties -> smallest b
    rate0 = num_sampling[gid] / (fixed_ms[gid] + verify_ms(num_scheduled[gid]))  # b = 0
    budget = np.where(rate0 >= best, 0, first_best)  # [G']
    winners = rank < budget[seg]  # [M]
    return np.bincount(row[winners], minlength=s_rows).astype(np.int64)
