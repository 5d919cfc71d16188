"""Split the vLLM-vs-avkit acceptance comparison at the point where the two engines' greedy outputs diverge.

    python bench/vllm_trace_prefix.py [VLLM_TRACE] [AVKIT_TRACE]

Requests are joined on their prompt token ids (as bench/vllm_trace_compare.py does). A draft slot at
(step, position) drafts output token `idx` = (tokens emitted before the step, counting the prefill's first
token) + position; it sees the same context in both engines while idx <= the length of the two outputs'
common prefix. Acceptance over those slots compares the engines on identical contexts; after the
divergence the two engines are drafting different texts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import polars as pl

KEYS = ["run_id", "request_id"]


def _read(trace: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    gen = str(Path(trace).with_suffix("")) + ".generations.parquet"
    cast = pl.col("run_id", "dataset", "request_id").cast(pl.String)
    return pl.read_parquet(trace).with_columns(cast), pl.read_parquet(gen).with_columns(cast)


def _with_output_index(t: pl.DataFrame) -> pl.DataFrame:
    emitted = pl.col("num_accepted") + 1  # tokens a step emits
    steps = (t.group_by([*KEYS, "step"]).agg(pl.col("num_accepted").first()).sort([*KEYS, "step"])
             .with_columns((emitted.cum_sum().over(KEYS) - emitted + 1).alias("off")))
    return t.join(steps.select([*KEYS, "step", "off"]), on=[*KEYS, "step"]).with_columns(
        (pl.col("off") + pl.col("position")).alias("idx"))


def main(vllm_trace: str, avkit_trace: str) -> None:
    (vt, vg), (at, ag) = _read(vllm_trace), _read(avkit_trace)
    pk = pl.col("prompt_ids").hash().alias("pk")
    j = vg.with_columns(pk).join(ag.with_columns(pk), on="pk", suffix="_a").filter(pl.col("dataset") == pl.col("dataset_a"))
    rows = []
    for r in j.iter_rows(named=True):  # one per request: the common prefix of two token lists
        a, b = np.asarray(r["output_ids"]), np.asarray(r["output_ids_a"])
        n = min(a.size, b.size)
        diff = np.flatnonzero(a[:n] != b[:n])
        rows.append((r["run_id"], r["request_id"], r["run_id_a"], r["request_id_a"], r["dataset"],
                     int(diff[0]) if diff.size else n, n))
    m = pl.DataFrame(rows, orient="row", schema=["run_id", "request_id", "run_id_a", "request_id_a", "dataset",
                                                  "common", "shorter"])
    print(m.group_by("dataset").agg(pl.len().alias("requests"), (pl.col("common") == pl.col("shorter")).sum()
                                    .alias("identical outputs"), (pl.col("common") / pl.col("shorter")).mean()
                                    .alias("mean common fraction")).sort("dataset"))
    sides = {"vLLM": (vt, m.select([*KEYS, "common"])),
             "avkit": (at, m.select(["run_id_a", "request_id_a", "common"]).rename(
                 {"run_id_a": "run_id", "request_id_a": "request_id"}))}
    print("| engine | slots | dataset | labelled | per-slot acceptance |\n|---|---|---|---:|---:|")
    for name, (t, common) in sides.items():
        s = _with_output_index(t).join(common, on=KEYS).filter(pl.col("accepted").is_not_null())
        for before in (True, False):
            part = s.filter((pl.col("idx") <= pl.col("common")) == before)
            for ds, n, acc in part.group_by("dataset").agg(pl.len(), pl.col("accepted").mean()).sort("dataset").rows():
                print(f"| {name} | {'same context' if before else 'after divergence'} | {ds} | {n:,} | {acc:.4f} |")


if __name__ == "__main__":
    main(*(sys.argv[1:] or ["traces/vllm/vllm_greedy_k7.parquet", "traces/greedy_k7.parquet"]))
