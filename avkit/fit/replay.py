"""Replay observed slots through an estimator: online rounds as they happened live, or batch.

Online replay: for each refit round in engine-step order, predict every slot of the round with
the coefficients the live estimator had when drafting (fixed within a round), add the round's
O(K) statistics, refit. The predictions are progressive validation: each is made before its
label was learned from, so online scores are honest out-of-sample scores. Cost: one predict and
a few bincounts per round (vectorized over the round's slots), no per-step Python loop.
Batch: the same Newton step iterated to convergence; scores are in-sample.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import polars as pl

from avkit.fit.data import FitData


def _coef_row(est, round_index: int, engine_step, applied: bool, observations: int) -> dict:
    row = {"round": round_index, "engine_step": engine_step, "applied": applied, "observations": observations}
    slopes = getattr(est, "slopes", None)
    for i in range(est.k):
        row[f"slope_{i}" if slopes is not None else "slope"] = float(slopes[i] if slopes is not None else est.slope)
        row[f"intercept_{i}"] = float(est.intercepts[i])
    return row


def online_replay(est, data: FitData, feature: np.ndarray, refit_interval: int,
                  on_round: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, list[dict]]:
    """-> (predictions made when drafting [N], one trajectory row per refit round)."""
    bounds = data.round_bounds(refit_interval)
    preds = np.empty(len(feature))
    rows = []
    num_rounds = len(bounds) - 1
    for r, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        f, pos = feature[lo:hi], data.positions[lo:hi]  # [n_r] the round's observed slots
        preds[lo:hi] = est.predict(f, pos)
        est.accumulate(f, pos, preds[lo:hi], data.labels[lo:hi])
        applied = est.refit()
        rows.append(_coef_row(est, r, int(data.engine_step[hi - 1]), applied, int(hi - lo)))
        rows[-1]["file"] = int(data.file_index[hi - 1])  # engine steps restart in each trace file
        if on_round is not None and (r % 64 == 63 or r == num_rounds - 1):
            on_round(r + 1, num_rounds)
    return preds, rows


def batch_fit(est, data: FitData, feature: np.ndarray, *, max_iter: int, tol: float) -> tuple[np.ndarray, list[dict]]:
    """-> (in-sample predictions [N], one trajectory row per Newton iteration)."""
    rows: list[dict] = []
    est.fit(feature, data.positions, data.labels, max_iter=max_iter, tol=tol,
            on_iteration=lambda e: rows.append(_coef_row(e, len(rows), None, True, len(feature))))
    return est.predict(feature, data.positions), rows


def trajectory_frame(rows: list[dict]) -> pl.DataFrame:
    """Trajectory rows -> a frame with fixed dtypes (engine_step is null for batch iterations)."""
    frame = pl.DataFrame(rows, infer_schema_length=None)
    if "file" not in frame.columns:  # batch iterations span every file
        frame = frame.with_columns(pl.lit(None, dtype=pl.Int64).alias("file"))
    return frame.with_columns(pl.col("round").cast(pl.Int64), pl.col("engine_step").cast(pl.Int64),
                              pl.col("observations").cast(pl.Int64), pl.col("file").cast(pl.Int64))


__all__ = ["batch_fit", "online_replay", "trajectory_frame"]
