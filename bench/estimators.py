"""Both online estimators (vLLM-style `online_logistic`, `forgetting_logistic`) on every shipped trace.

Prequential scores (each slot predicted before its label was learned from, as live) of logit(q_max):
  - each shipped trace, and both together (the `avkit fit` default; files are successive runs);
  - a batch-1 synthetic trace without `engine_step` (slope 0.6, 420k slots, 50 steps a request);
  - a workload shift: the sampled trace's HumanEval rows, then its ShareGPT rows, in file order, 8
    (request_id, step) groups an engine step (the recorded concurrency): the rolling ECE over the
    last 200 engine steps, for both estimators (a plot), and how many steps after the switch each
    needs until it is back under 0.02 (`back`) and until it stays there (`for good`).
Writes bench/results/estimators.md and bench/results/estimators_shift.png (temp files, then rename).

    python bench/estimators.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from avkit.config import SyntheticConfig
from avkit.estimators import make_estimator
from avkit.fit.data import load_fit_data
from avkit.fit.replay import online_replay
from avkit.metrics import auc, ece, log_loss
from avkit.trace.synthetic import synthetic_trace

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results"
ESTIMATORS = ("online_logistic", "forgetting_logistic")
WINDOW, GOAL, BINS = 200, 0.02, 10


def rolling_ece(p: np.ndarray, y: np.ndarray, row_step: np.ndarray, n_steps: int) -> np.ndarray:
    """[G] ECE (10 bins) of the slots of engine steps (t - WINDOW, t]; NaN before a full window."""
    b = np.minimum((p * BINS).astype(np.int64), BINS - 1)
    cell = row_step * BINS + b  # [N]
    sums = [np.bincount(cell, weights=w, minlength=n_steps * BINS).reshape(n_steps, BINS)
            for w in (np.ones_like(p), p, y)]  # [G, B] each
    cum = [np.vstack([np.zeros((1, BINS)), np.cumsum(s, axis=0)]) for s in sums]
    win = [c[WINDOW:] - c[:-WINDOW] for c in cum]  # [G - WINDOW + 1, B]
    n, sp, sy = win
    out = np.full(n_steps, np.nan)
    out[WINDOW - 1:] = np.abs(sp - sy).sum(axis=1) / np.maximum(n.sum(axis=1), 1)
    return out


def recovered(curve: np.ndarray, switch: int) -> tuple[int | None, int | None]:
    """Engine steps after `switch` until the rolling ECE is back under GOAL after its first excursion
    above it, and until it stays under GOAL for the rest of the trace (None: never)."""
    after = curve[switch:]
    above = np.flatnonzero(~(after < GOAL))
    if above.size == 0:
        return 0, 0
    below = np.flatnonzero((after < GOAL) & (np.arange(after.size) > above[0]))
    back = int(below[0]) if below.size else None
    return back, (int(above[-1]) + 1 if above[-1] + 1 < after.size else None)


def score(paths) -> tuple[dict, object]:
    data = load_fit_data(paths)
    out = {}
    for name in ESTIMATORS:
        est = make_estimator(name, k=data.k)
        p, rows = online_replay(est, data, data.features["logit_qmax"])
        out[name] = {"p": p, "auc": auc(data.labels, p), "log_loss": log_loss(data.labels, p),
                     "ece": ece(data.labels, p), "refits": len(rows), "slope": est.slope}
    return out, data


def shift_trace(tmp: Path) -> tuple[Path, int]:
    """HumanEval rows then ShareGPT rows of the sampled trace, in file order; every 8 consecutive
    (request_id, step) groups make one engine step (the recorded concurrency) -> (path, switch row)."""
    df = pl.read_parquet(ROOT / "traces" / "sampled_t1.0_k7.parquet")
    parts = [df.filter(pl.col("dataset").cast(pl.String) == d) for d in ("humaneval", "sharegpt")]
    both = pl.concat(parts)
    rid = both["request_id"].cast(pl.String)
    group = ((rid != rid.shift(1)) | (both["step"] != both["step"].shift(1))).fill_null(True).cast(pl.Int64).cum_sum() - 1
    table = both.with_columns((group // 8).alias("engine_step")).to_arrow()
    table = table.replace_schema_metadata(pq.read_schema(ROOT / "traces" / "sampled_t1.0_k7.parquet").metadata)
    pq.write_table(table, tmp / "code_then_chat.parquet")
    return tmp / "code_then_chat.parquet", parts[0].height


def plot(curves: dict, switch: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    for name, curve in curves.items():
        ax.plot(np.arange(curve.size), curve, label=name, lw=1.2)
    ax.axvline(switch, color="k", ls=":", lw=1, label="HumanEval -> ShareGPT")
    ax.axhline(GOAL, color="grey", ls="--", lw=0.8)
    ax.set(xlabel="engine step", ylabel=f"ECE of the last {WINDOW} steps", ylim=(0, None),
           title="Prequential calibration through a workload shift")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    cfg = SyntheticConfig(num_slots=420_000, slope=0.6, batch_size=1, steps_per_request=50, seed=0)
    pq.write_table(synthetic_trace(cfg).drop_columns(["engine_step"]), tmp / "synthetic_b1.parquet")
    shift_path, _ = shift_trace(tmp)
    traces = {"sampled_t1.0_k7": [ROOT / "traces/sampled_t1.0_k7.parquet"],
              "greedy_k7": [ROOT / "traces/greedy_k7.parquet"],
              "both (avkit fit default)": [ROOT / "traces/greedy_k7.parquet", ROOT / "traces/sampled_t1.0_k7.parquet"],
              "synthetic batch 1, no engine_step": [tmp / "synthetic_b1.parquet"],
              "HumanEval then ShareGPT (8 step rows an engine step)": [shift_path]}
    lines = ["# Online estimators: vLLM-style vs forgetting", "",
             "Prequential logit(q_max) scores (10-bin ECE); `python bench/estimators.py`.", "",
             "| trace | estimator | engine steps | refits | AUC | log-loss | ECE | final slope |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    curves, switch = {}, 0
    for label, paths in traces.items():
        res, data = score(paths)
        for name, r in res.items():
            lines.append(f"| {label} | {name} | {data.step_file.size} | {r['refits']} | {r['auc']:.4f} | "
                         f"{r['log_loss']:.4f} | {r['ece']:.4f} | {r['slope']:.4f} |")
        if paths == [shift_path]:
            first_chat = int(np.flatnonzero(np.array(data.dataset_names)[data.dataset_codes] == "sharegpt")[0])
            switch = int(data.row_step[first_chat])
            curves = {n: rolling_ece(r["p"], data.labels, data.row_step, data.step_file.size) for n, r in res.items()}
    lines += ["", f"Workload shift: {switch} HumanEval engine steps, then ShareGPT. Rolling ECE over the last "
              f"{WINDOW} engine steps; steps after the switch until it is back under {GOAL} (after first rising "
              "above it) and until it stays under it for the rest of the trace.", "",
              "| estimator | peak after switch | back under (steps) | under for good (steps) | mean rolling ECE after switch |",
              "|---|---:|---:|---:|---:|"]
    for name, c in curves.items():
        back, good = recovered(c, switch)
        lines.append(f"| {name} | {np.nanmax(c[switch:]):.4f} | {'never' if back is None else back} | "
                     f"{'never' if good is None else good} | {np.nanmean(c[switch:]):.4f} |")
    lines += ["", "![rolling ECE](estimators_shift.png)", ""]
    OUT.mkdir(parents=True, exist_ok=True)
    tmp_md, tmp_png = OUT / f".estimators.md.{os.getpid()}.tmp", OUT / f".estimators_shift.{os.getpid()}.png"
    tmp_md.write_text("\n".join(lines))
    plot(curves, switch, tmp_png)
    os.replace(tmp_md, OUT / "estimators.md")
    os.replace(tmp_png, OUT / "estimators_shift.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
