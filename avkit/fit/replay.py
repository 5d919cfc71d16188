"""Replay observed slots through an estimator online, as it ran live.

Each file is one run of the live estimator, its engine steps fed through `estimators.rounds.replay_steps`
(the simulator's driver) into the `estimator.update` the live policy calls: each round predicted with the
coefficients the live estimator had when drafting, a refit after exactly `refit_interval` engine steps, a
file's trailing partial round dropped. Each prediction is made before its label is learned from
(progressive validation: honest out-of-sample scores). The state carries over from one file to the next
(a restart from the server's snapshot); with `--replicas independent` (docs/fleet.md) each file is
replayed on its own estimator, one task per (feature, replica), and the replica that observed the most
slots is written.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from avkit.estimators.rounds import replay_steps
from avkit.fit.data import FitData


def coef_row(est, round_index: int, engine_step, applied: bool, observations: int) -> dict:
    row = {"round": round_index, "engine_step": engine_step, "applied": applied, "observations": observations}
    slopes = getattr(est, "slopes", None)
    for i in range(est.k):
        row[f"slope_{i}" if slopes is not None else "slope"] = float(slopes[i] if slopes is not None else est.slope)
        row[f"intercept_{i}"] = float(est.intercepts[i])
    return row


@dataclass(frozen=True)
class Run:
    """One run (trace file: a server process, a replica) of observed slots, in engine-step order."""

    feature: np.ndarray  # [n] the estimator's raw feature
    positions: np.ndarray  # [n]
    labels: np.ndarray  # [n] int8 in {0, 1}
    bounds: np.ndarray  # [G + 1] first row of each engine step of the run
    clock: np.ndarray  # [G] recorded engine_step (or ordinal) of each step
    file: int  # index of the trace file


def runs_of(data: FitData, feature: np.ndarray) -> list[tuple[slice, Run]]:
    """-> (row slice, Run) of each file of `data`, in order (views, no copies)."""
    labels = data.labels.astype(np.int8)
    return [(slots, Run(feature[slots], data.positions[slots], labels[slots],
                        data.step_bounds[steps.start:steps.stop + 1] - slots.start, data.step_clock[steps],
                        int(data.step_file[steps.start]))) for steps, slots in data.runs()]


def replay_run(est, run: Run, rows: list[dict], on_step: Callable[[int], None] | None = None) -> np.ndarray:
    """Replay one run through `est`, one trajectory row per refit appended to `rows` (its `round` counting
    on from len(rows)); -> predictions made when drafting [n]."""
    last = {"row": 0, "rejected": getattr(est, "rejected", 0)}

    def after(g: int, refit: bool) -> None:
        if refit:  # the round [last row, end of step g) was refitted
            rejected = getattr(est, "rejected", 0)
            rows.append({**coef_row(est, len(rows), int(run.clock[g]), rejected == last["rejected"],
                                     int(run.bounds[g + 1]) - last["row"]), "file": run.file})
            last.update(row=int(run.bounds[g + 1]), rejected=rejected)
        if on_step is not None:
            on_step(g + 1)

    return replay_steps(est, run.feature, run.positions, run.labels, run.bounds, on_round=after)


def online_replay(est, data: FitData, feature: np.ndarray,
                  on_round: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, list[dict]]:
    """-> (predictions made when drafting [N], one trajectory row per refit), the files one chain."""
    preds = np.empty(len(feature))
    rows: list[dict] = []
    total, done = data.step_file.size, 0
    for slots, run in runs_of(data, feature):
        step = None if on_round is None else (lambda g, done=done: on_round(done + g, total))
        preds[slots] = replay_run(est, run, rows, step)
        done += run.clock.size
    return preds, rows


def replay_replica(est, run: Run) -> tuple[np.ndarray, list[dict], object]:
    """Task body: one replica through its own copy of the start estimator (threads share the start);
    -> (predictions [n], rows, estimator)."""
    est = copy.deepcopy(est)
    rows: list[dict] = []
    return replay_run(est, run, rows), rows, est


def online_replicas(estimators: list, features: list[np.ndarray], data: FitData, engine) -> list[tuple]:
    """Every (start estimator, feature) pair over every replica of `data` in one map on `engine`; -> per pair
    (the written estimator, predictions [N], trajectory rows)."""
    runs = [runs_of(data, f) for f in features]  # [E] x [R] (row slice, Run)
    results = iter(engine.map(replay_replica, [(est, run) for est, pairs in zip(estimators, runs)
                                                for _, run in pairs])[0])
    out = []
    for pairs in runs:
        preds, rows, best = np.empty(data.labels.size), [], (-1, None)
        for slots, _ in pairs:
            p, r, est = next(results)
            preds[slots] = p
            rows += r
            best = max(best, (slots.stop - slots.start, est), key=lambda b: b[0])  # first on a tie
        out.append((best[1], preds, rows))
    return out


def trajectory_frame(rows: list[dict], k: int, per_position_slope: bool = False) -> pl.DataFrame:
    """Trajectory rows -> a frame with fixed dtypes (engine_step and file null for batch iterations; no
    refit: empty, the same columns)."""
    slopes = [f"slope_{i}" for i in range(k)] if per_position_slope else ["slope"]
    schema = {"round": pl.Int64, "engine_step": pl.Int64, "file": pl.Int64, "applied": pl.Boolean,
              "observations": pl.Int64, **{c: pl.Float64 for c in slopes},
              **{f"intercept_{i}": pl.Float64 for i in range(k)}}
    if not rows:
        return pl.DataFrame(schema=schema)
    frame = pl.DataFrame(rows, infer_schema_length=None)
    if "file" not in frame.columns:  # batch iterations span every file
        frame = frame.with_columns(pl.lit(None, dtype=pl.Int64).alias("file"))
    return frame.select(pl.col(c).cast(t) for c, t in schema.items())
