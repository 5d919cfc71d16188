"""Per dataset: does the best HVD router match the best single drafter? (HVD must never lose
by more than noise, >= 0.99x the better of model-only and cache-only on every dataset; cache-only is
SuffixDecoding alone, the `suffix` router: no draft model where the cache has nothing.)

Every router, the joint `survival+budget` included, decodes the dataset's test requests one at a time
(`simulate_batched` at concurrency 1, so all share one cost accounting: a cycle costs
1 + c_v (1 + verified) + c_d K when the draft model ran + c_cache when the cache was consulted).
Glossary:
  best_single   max(model, suffix) throughput on the dataset
  best_hvd      the best router that can pick per position (cache first, arctic, table, mlp,
                survival, survival+budget), named in `best_router`
  cycles        target verifications per 1000 tokens; `fewer_cycles` = 1 - best_hvd's / best_single's
  ratio         best_hvd / best_single; `holds` = ratio >= 0.99
  oracle        the clairvoyant router's throughput (`avkit/hvd/oracle.py`): the most any router can make
                of these drafts at this K and cost model; `headroom` = oracle / best_single bounds `ratio`
"""

from __future__ import annotations

import numpy as np
import polars as pl

from avkit.hvd.joint_budget import simulate_batched
from avkit.hvd.oracle import oracle_paths

SINGLE = ("model", "suffix")
HVD = ("cache", "arctic", "table", "mlp", "survival", "survival+budget")
FLOOR = 0.99


def dataset_verdict(test: pl.DataFrame, fitted: dict, ctx) -> pl.DataFrame:
    """[datasets] throughput (tokens per target forward) and cycles per 1k tokens of every router at
    concurrency 1, the best single drafter, the best HVD router and whether it holds >= 0.99x."""
    rows = []
    for (name,), part in test.group_by("dataset", maintain_order=True):
        row: dict = {"dataset": name, "requests": part["request_id"].n_unique()}  # test requests it rests on
        for router in (*SINGLE, *HVD):
            base = "survival" if router == "survival+budget" else router
            if base not in fitted:
                continue
            r = fitted[base]
            surv = r.survivals(part, ctx) if router == "survival+budget" else None
            sim = simulate_batched(part, r.route(part, ctx), ctx.cost, ctx.k, 1, surv)
            row[router] = sim["throughput"]
            row[f"cycles_per_1k[{router}]"] = 1000.0 * sim["steps"] / sim["tokens"]
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


def verdict_line(v: pl.DataFrame) -> str:
    held = int(np.sum(v["holds"].to_numpy()))
    return (f"Best HVD router >= {FLOOR}x the best single drafter on {held}/{v.height} datasets "
            f"(per-dataset ratio {', '.join(f'{d} {r:.3f}' for d, r in zip(v['dataset'], v['ratio']))}); "
            f"a clairvoyant router's headroom over it: "
            f"{', '.join(f'{d} {h:.3f}' for d, h in zip(v['dataset'], v['headroom']))}.")


__all__ = ["FLOOR", "dataset_verdict", "verdict_line"]
