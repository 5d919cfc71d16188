"""Replay observed slots through an estimator: online as it ran live, or batch.

Online replay: each file is one run of the live estimator; its engine steps are fed through
`estimators.rounds.replay_steps`, the same driver the simulator uses, with the same
`estimator.update` the live policy calls. Each round is predicted with the coefficients the live
estimator had when drafting, the estimator refits after exactly `refit_interval` engine steps, and
a file's trailing partial round is dropped. The predictions are progressive validation: each is
made before its label was learned from, so online scores are honest out-of-sample scores. The
estimator's state carries over from one file to the next (a restart from the server's snapshot).
Batch: the same Newton step iterated to convergence; scores are in-sample.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from avkit.estimators.rounds import replay_steps
from avkit.fit.data import FitData


def _coef_row(est, round_index: int, engine_step, applied: bool, observations: int) -> dict:
    row = {"round": round_index, "engine_step": engine_step, "applied": applied, "observations": observations}
    slopes = getattr(est, "slopes", None)
    for i in range(est.k):
        row[f"slope_{i}" if slopes is not None else "slope"] = float(slopes[i] if slopes is not None else est.slope)
        row[f"intercept_{i}"] = float(est.intercepts[i])
    return row


def online_replay(est, data: FitData, feature: np.ndarray,
                  on_round: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, list[dict]]:
    """-> (predictions made when drafting [N], one trajectory row per refit)."""
    preds = np.empty(len(feature))
    labels = data.labels.astype(np.int8)
    rows: list[dict] = []
    total = data.step_file.size
    for steps, slots in data.runs():
        bounds = data.step_bounds[steps.start:steps.stop + 1] - slots.start  # [G_run + 1]
        clock, last = data.step_clock[steps], {"row": 0, "rejected": getattr(est, "rejected", 0)}

        def after(g: int, refit: bool, bounds=bounds, clock=clock, start=steps.start, last=last) -> None:
            if refit:  # the round [last row, end of step g) was refitted
                rejected = getattr(est, "rejected", 0)
                rows.append(_coef_row(est, len(rows), int(clock[g]), rejected == last["rejected"],
                                      int(bounds[g + 1]) - last["row"]))
                last.update(row=int(bounds[g + 1]), rejected=rejected)
            if on_round is not None:
                on_round(start + g + 1, total)

        preds[slots] = replay_steps(est, feature[slots], data.positions[slots], labels[slots], bounds,
                                    on_round=after)
    return preds, rows


def batch_fit(est, data: FitData, feature: np.ndarray, *, max_iter: int, tol: float) -> tuple[np.ndarray, list[dict]]:
    """-> (in-sample predictions [N], one trajectory row per Newton iteration)."""
    rows: list[dict] = []
    est.fit(feature, data.positions, data.labels, max_iter=max_iter, tol=tol,
            on_iteration=lambda e: rows.append(_coef_row(e, len(rows), None, True, len(feature))))
    return est.predict(feature, data.positions), rows


def trajectory_frame(rows: list[dict], k: int, per_position_slope: bool = False) -> pl.DataFrame:
    """Trajectory rows -> a frame with fixed dtypes (engine_step is null for batch iterations); a replay
    too short for one refit gives an empty frame with the same columns."""
    slopes = [f"slope_{i}" for i in range(k)] if per_position_slope else ["slope"]
    schema = {"round": pl.Int64, "engine_step": pl.Int64, "applied": pl.Boolean, "observations": pl.Int64,
              **{c: pl.Float64 for c in slopes}, **{f"intercept_{i}": pl.Float64 for i in range(k)}}
    if not rows:
        return pl.DataFrame(schema=schema)
    return pl.DataFrame(rows, infer_schema_length=None).select(pl.col(c).cast(t) for c, t in schema.items())


__all__ = ["batch_fit", "online_replay", "trajectory_frame"]
