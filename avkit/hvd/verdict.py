"""Per dataset: does the best HVD router match the best single drafter (>= 0.99x the better of model-only and
cache-only, the `suffix` router), and how far could any router go (docs/hvd.md)?

Every router decodes the dataset's test requests one at a time (`evaluate`'s paths; the joint budget:
`simulate_batched` at concurrency 1). Columns: best_single = max(model, suffix) throughput; best_hvd = the best
of cache, arctic, table, mlp, survival, survival+budget (`best_router`); ratio = best_hvd / best_single, `holds`
= ratio >= 0.99; fewer_cycles = 1 - best_hvd's / best_single's cycles per 1k tokens; oracle = the clairvoyant
router's throughput, headroom = oracle / best_single (an upper bound of ratio).

The oracle: at every position t a router picks a plain target step, the cache draft's first b tokens, or b
draft-model passes. Knowing the accepted lengths (`cache_acc[t]`, `model_acc[t]`), it never verifies a token
it will reject, so its best decode of a request is the cheapest path through positions 0..n, by dynamic
programming from the end:

    C[t] = min over b = 0..K of  verify(1 + b) + C[t + b + 1] + { c_cache           b <= cache_acc[t]
                                                                  { draft(1, b)       b <= model_acc[t]
    C[t >= n] = 0,   throughput = n / C[0]   (tokens per target forward, requests one at a time)

It prices every option as `simulate_batched` at concurrency 1 does but charges the draft model no catch-up,
so no real router under the same cost model beats it. Vectorized over requests and draft lengths.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from avkit.hvd.path import request_runs
from avkit.hvd.router import decode_batched
from avkit.scheduling.cost import CostTable

SINGLE = ("model", "suffix")
HVD = ("cache", "arctic", "table", "mlp", "survival", "survival+budget")
FLOOR = 0.99


def oracle_paths(table: pl.DataFrame, cost: CostTable, k: int) -> dict[str, float]:
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
    via_cache = cost.step_cost(1, 0, 1 + b, lookups=b > 0)  # [K + 1] one request verifying b drafts
    via_model = cost.step_cost(1, b, 1 + b)  # [K + 1]
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


def dataset_verdict(test: pl.DataFrame, metrics: pl.DataFrame, fitted: dict, ctx) -> pl.DataFrame:
    """[datasets] throughput (tokens per target forward) and cycles per 1k tokens of every router at
    concurrency 1 (from `evaluate`'s `metrics`), the best single drafter, the best HVD router, whether it holds."""
    rows = []
    for (name,), part in test.group_by("dataset", maintain_order=True):
        row: dict = {"dataset": name, "requests": part["request_id"].n_unique()}  # test requests it rests on
        scored = {r["router"]: (r["throughput"], r["cycles_per_1k"])
                  for r in metrics.filter(pl.col("dataset") == name).iter_rows(named=True)}
        for router in (r for r in (*SINGLE, *HVD) if r.removesuffix("+budget") in fitted):
            if router not in scored:  # the joint budget, which `evaluate` does not score
                sim = decode_batched(fitted, router, part, ctx, 1)
                scored[router] = sim["throughput"], 1000.0 * sim["steps"] / sim["tokens"]
            row[router], row[f"cycles_per_1k[{router}]"] = scored[router]
        single = {k: row[k] for k in SINGLE if k in row}
        hvd = {k: row[k] for k in HVD if k in row}
        best_single, best = max(single.values()), max(hvd, key=hvd.get)
        single_name = max(single, key=single.get)
        fewer = 1.0 - row[f"cycles_per_1k[{best}]"] / row[f"cycles_per_1k[{single_name}]"]
        oracle = oracle_paths(part, ctx.cost, ctx.k)
        row.update(best_single=best_single, best_single_router=single_name, best_hvd=hvd[best],
                   best_router=best, ratio=hvd[best] / best_single, fewer_cycles=fewer,
                   holds=bool(hvd[best] >= FLOOR * best_single), oracle=oracle["throughput"],
                   headroom=oracle["throughput"] / best_single,
                   oracle_fewer_cycles=1.0 - 1000.0 * oracle["cycles"] / oracle["tokens"]
                   / row[f"cycles_per_1k[{single_name}]"])
        rows.append(row)
    return pl.DataFrame(rows).sort("dataset")


__all__ = ["FLOOR", "dataset_verdict", "oracle_paths"]
