"""The most any router can make of the two drafts: a clairvoyant router's throughput (an upper bound).

At every position t of a replayed request a router picks one of: a plain target step; the cache draft
with its first b tokens verified; the draft model run b passes with its b drafts verified. A router that
knows the accepted lengths (`cache_acc[t]`, `model_acc[t]`, the replay's oracle columns) never verifies
a token it will reject, so its best decode of a request is the cheapest path through positions
0..n, found exactly by dynamic programming from the end:

    C[t] = min over b = 0..K of  verify(1 + b) + C[t + b + 1] + { c_cache           b <= cache_acc[t]
                                                                  { b draft(1)        b <= model_acc[t]
    C[t >= n] = 0,   throughput = n / C[0]   (tokens per target forward, requests one at a time)

Nothing a real router decides can beat it under the same cost model: it prices every option as the
replay does (`simulate_batched` at concurrency 1), except that it charges the draft model no catch-up
(as if it followed every request), which only lowers its cost. So `oracle / best single drafter` is the
headroom of HVD routing with these drafts, this K and this device's costs (bench/results/hvd*.md).
The recursion runs over positions, vectorized over requests and draft lengths.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from avkit.hvd.cost import HvdCost
from avkit.hvd.path import request_runs


def oracle_paths(table: pl.DataFrame, cost: HvdCost, k: int) -> dict[str, float]:
    """Rows (request_id, t) contiguous and t-sorted, as `replay` writes them -> the clairvoyant router's
    tokens, cycles (target verifications), cost (target forwards) and throughput over all requests."""
    starts, lengths = request_runs(table)  # [R], [R]
    r, n = len(starts), int(lengths.max())
    t_of = np.arange(table.height) - np.repeat(starts, lengths)  # [rows] position within its request
    row_of = np.repeat(np.arange(r), lengths)  # [rows]

    def padded(col: str) -> np.ndarray:  # [R, n] per-request column, -1 past each request's end
        out = np.full((r, n), -1, dtype=np.int64)
        out[row_of, t_of] = table[col].to_numpy().astype(np.int64)
        return out

    cache_acc = np.minimum(padded("cache_acc"), padded("draft_len"))  # [R, n] (<= its draft, <= K)
    model_acc = np.minimum(padded("model_acc"), k)  # [R, n]
    b = np.arange(k + 1)  # [K + 1] drafts verified
    verify = cost.verify(1 + b)  # [K + 1] one request's forward over 1 + b tokens
    via_cache = verify + np.where(b > 0, cost.cache_cost, 0.0)  # [K + 1]
    via_model = verify + b * float(cost.draft(1))  # [K + 1]
    step = np.minimum(via_cache, via_model)  # [K + 1] where both drafts reach b, the cheaper
    total = np.zeros((r, n + k + 2))  # [R, n + K + 2] C[t]; 0 from the end of each request on
    cycles = np.zeros((r, n + k + 2))
    for t in range(n - 1, -1, -1):  # positions, from the end
        reach_c = b[None, :] <= cache_acc[:, t:t + 1]  # [R, K + 1]
        reach_m = b[None, :] <= model_acc[:, t:t + 1]
        price = np.where(reach_c & reach_m, step, np.where(reach_c, via_cache, via_model))  # [R, K + 1]
        price = np.where(reach_c | reach_m | (b == 0)[None, :], price, np.inf)
        cand = price + total[:, t + 1:t + k + 2]  # [R, K + 1] C[t + b + 1]
        best = np.argmin(cand, axis=1)  # [R]
        live = t < lengths  # [R] requests still decoding at t
        total[:, t] = np.where(live, cand[np.arange(r), best], 0.0)
        cycles[:, t] = np.where(live, 1.0 + cycles[np.arange(r), t + 1 + best], 0.0)
    tokens, spent = float(lengths.sum()), float(total[:, 0].sum())
    return {"tokens": tokens, "cycles": float(cycles[:, 0].sum()), "cost": spent, "throughput": tokens / spent}


__all__ = ["oracle_paths"]
