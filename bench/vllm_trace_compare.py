"""Per-dataset acceptance of a vLLM-recorded trace beside avkit's own engine's, on the same prompts.

    python bench/vllm_trace_compare.py traces/vllm/vllm_greedy_k7.parquet traces/greedy_k7.parquet [--out FILE.md]

Requests are joined on (dataset, prompt token ids) from the two generations tables, so only prompts that
finished in both runs count, whatever order or request ids each run gave them (a partial trace works:
its finished requests are compared). The markdown table is the README's (`--out` writes it atomically). Per dataset: labelled slots, per-slot acceptance with a 95% interval
(Wilson, over slots; slots of one request are correlated, so it is optimistic), the per-request
bootstrap interval of the difference (2,000 resamples of requests, seed 0), and tokens per request-step.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl

from avkit.tune.acceptance import wilson


def prompts(path: str) -> pl.DataFrame:
    """The finished requests of a trace: request_id, dataset, prompt (its token ids as one string)."""
    from avkit.trace.schema import generations_path

    g = pl.read_parquet(generations_path(path), columns=["request_id", "dataset", "prompt_ids"])
    return g.select(pl.col("request_id").cast(pl.Utf8), pl.col("dataset").cast(pl.Utf8),
                    pl.col("prompt_ids").list.eval(pl.element().cast(pl.Utf8)).list.join(" ").alias("prompt"))


def per_request(path: str, keys: pl.DataFrame) -> pl.DataFrame:
    """Per finished request of `keys`: labelled slots, accepted slots, request-steps; keyed by the prompt."""
    t = pl.read_parquet(path, columns=["request_id", "position", "accepted"])
    t = t.with_columns(pl.col("request_id").cast(pl.Utf8)).filter(pl.col("accepted").is_not_null())
    t = t.join(keys, on="request_id")
    return t.group_by("dataset", "prompt").agg(pl.len().alias("labelled"), pl.col("accepted").sum().alias("acc"),
                                               (pl.col("position") == 0).sum().alias("steps"))


def compare(vllm_path: str, native_path: str) -> str:
    kv, kn = prompts(vllm_path), prompts(native_path)
    same = kv.join(kn, on=["dataset", "prompt"]).select("dataset", "prompt")  # finished in both runs
    v = per_request(vllm_path, kv.join(same, on=["dataset", "prompt"]))
    n = per_request(native_path, kn.join(same, on=["dataset", "prompt"]))
    rng = np.random.default_rng(0)
    lines = ["| dataset | requests | vLLM labelled | vLLM per-slot acc [95%] | avkit labelled | avkit per-slot acc "
             "[95%] | difference, request bootstrap 95% | vLLM tokens/step | avkit tokens/step |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for ds in sorted(set(v["dataset"]) & set(n["dataset"])):
        a, b = v.filter(pl.col("dataset") == ds), n.filter(pl.col("dataset") == ds)
        both = a.join(b, on=["dataset", "prompt"], suffix="_n").sort("prompt")
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


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("vllm_trace")
    ap.add_argument("native_trace")
    ap.add_argument("--out", default="", help="also write the table here (temp file, then rename)")
    args = ap.parse_args()
    table = compare(args.vllm_trace, args.native_trace)
    print(table)
    if args.out:
        out = Path(args.out)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(table + "\n")
        os.replace(tmp, out)


if __name__ == "__main__":
    main()
