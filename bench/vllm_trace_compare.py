"""Per-dataset acceptance of a vLLM-recorded trace beside avkit's own engine's, on the same prompts.

    python bench/vllm_trace_compare.py traces/vllm_greedy_k7.parquet traces/greedy_k7.parquet

Only requests that finished in both runs count (same workloads, seed and prompt filter select the same
prompts in the same order). Per dataset: labelled slots, per-slot acceptance with a 95% interval
(Wilson, over slots; slots of one request are correlated, so it is optimistic), the per-request
bootstrap interval of the difference (2,000 resamples of requests, seed 0), and tokens per request-step.
"""

from __future__ import annotations

import sys

import numpy as np
import polars as pl

from avkit.engines.vllm.metrics import wilson


def per_request(path: str, keep: set[str]) -> pl.DataFrame:
    t = pl.read_parquet(path, columns=["dataset", "request_id", "position", "accepted"])
    t = t.with_columns(pl.col("dataset").cast(pl.Utf8), pl.col("request_id").cast(pl.Utf8))
    t = t.filter(pl.col("request_id").is_in(list(keep)) & pl.col("accepted").is_not_null())
    return t.group_by("dataset", "request_id").agg(pl.len().alias("labelled"),
                                                   pl.col("accepted").sum().alias("acc"),
                                                   (pl.col("position") == 0).sum().alias("steps"))


def compare(vllm_path: str, native_path: str) -> str:
    from avkit.trace.schema import generations_path

    ids = [set(pl.read_parquet(generations_path(p), columns=["request_id"])["request_id"].cast(pl.Utf8)) for p in
           (vllm_path, native_path)]  # requests that finished in both runs
    keep = ids[0] & ids[1]
    v, n = per_request(vllm_path, keep), per_request(native_path, keep)
    rng = np.random.default_rng(0)
    lines = ["| dataset | requests | vLLM labelled | vLLM per-slot acc [95%] | avkit labelled | avkit per-slot acc "
             "[95%] | difference, request bootstrap 95% | vLLM tokens/step | avkit tokens/step |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for ds in sorted(set(v["dataset"]) & set(n["dataset"])):
        a = v.filter(pl.col("dataset") == ds).sort("request_id")
        b = n.filter(pl.col("dataset") == ds).sort("request_id")
        both = a.join(b, on="request_id", suffix="_n")
        rate = lambda acc, lab: acc.sum() / lab.sum()
        av, an = rate(both["acc"].to_numpy(), both["labelled"].to_numpy()), rate(both["acc_n"].to_numpy(),
                                                                                  both["labelled_n"].to_numpy())
        idx = rng.integers(0, both.height, (2000, both.height))  # [B, R] resampled requests
        diffs = (both["acc"].to_numpy()[idx].sum(1) / both["labelled"].to_numpy()[idx].sum(1)
                 - both["acc_n"].to_numpy()[idx].sum(1) / both["labelled_n"].to_numpy()[idx].sum(1))
        lo, hi = np.quantile(diffs, [0.025, 0.975])
        wv, wn = wilson(int(both["acc"].sum()), int(both["labelled"].sum())), wilson(int(both["acc_n"].sum()),
                                                                                     int(both["labelled_n"].sum()))
        tps = lambda acc, steps: (acc.sum() + steps.sum()) / steps.sum()
        lines.append(f"| {ds} | {both.height} | {int(both['labelled'].sum()):,} | {av:.3f} [{wv[0]:.3f}, {wv[1]:.3f}] "
                     f"| {int(both['labelled_n'].sum()):,} | {an:.3f} [{wn[0]:.3f}, {wn[1]:.3f}] | {av - an:+.3f} "
                     f"[{lo:+.3f}, {hi:+.3f}] | {tps(both['acc'], both['steps']):.2f} | "
                     f"{tps(both['acc_n'], both['steps_n']):.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(compare(sys.argv[1], sys.argv[2]))
