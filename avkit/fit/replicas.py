"""`avkit fit --mode online --replicas independent`: each trace file is a replica with its own live estimator.

A fleet's replicas each run their own estimator: replica r predicts its drafts with the
coefficients IT has refitted from its own engine steps, so its online (progressive-validation)
predictions depend on its own trace only. The replay is therefore a map over replicas:
  task        one (feature, replica): a fresh estimator (or a copy of the warm-started one) replayed
              through that replica's engine steps in order (`replay.replay_run`, as `--replicas chain`
              replays each file), -> (predictions [n_r], trajectory rows, the final estimator)
  engine      `LocalEngine` threads (`--engine memory`) or `RayEngine` tasks (`--engine ray`, fit/engines.py): the same
              task function either way, so both give bit-identical predictions and coefficients
  reduce      predictions concatenated in file order and scored as one set (the score table of the
              memory fit, exact); trajectory rows of every replica (column `file`; `round` counts
              each replica's own refits from 0)
  written     coefficients.json holds the estimator of the replica that observed the most slots (the
              first such file on a tie): the fleet's best-supported live state
The observed slots are read and checked once, on the driver (fit/data.py); a task gets its run's
arrays (a few MB per million slots), so a Ray worker needs no access to the trace files.
"""

from __future__ import annotations

import copy

import numpy as np

from avkit.fit.data import FitData
from avkit.fit.replay import Run, replay_run, runs_of


def replay_replica(est, run: Run) -> tuple[np.ndarray, list[dict], object]:
    """Task body: replay one replica through its own copy of the start estimator `est` (Ray hands a
    task's arrays over read-only, and threads share the start); -> (predictions [n], rows, estimator)."""
    est = copy.deepcopy(est)
    rows: list[dict] = []
    preds = replay_run(est, run, rows)
    return preds, rows, est


def online_replicas(estimators: list, features: list[np.ndarray], data: FitData, engine) -> list[tuple]:
    """Replay every (estimator, feature) pair over every replica of `data` on `engine` (one map for all
    of them); estimators are the start states (each task replays a copy).
    -> per pair (the written estimator, predictions [N], trajectory rows)."""
    runs = [runs_of(data, f) for f in features]  # [E] x [R] (row slice, Run)
    items = [(est, run) for est, pairs in zip(estimators, runs) for _, run in pairs]
    results, _ = engine.map(replay_replica, items)
    out, i = [], 0
    for pairs in runs:
        preds, rows, best = np.empty(data.labels.size), [], None
        for slots, _ in pairs:
            p, r, est = results[i]
            i += 1
            preds[slots] = p
            rows += r
            if best is None or slots.stop - slots.start > best[0]:
                best = (slots.stop - slots.start, est)
        out.append((best[1], preds, rows))
    return out


__all__ = ["online_replicas", "replay_replica"]
