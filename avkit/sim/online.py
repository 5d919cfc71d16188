"""Burn-in of the simulator's online estimators: the traces replayed in recorded engine-step order (without
one: 8 step rows a step), labels as recorded, through estimators/rounds.py until `min_refits` refit rounds.
"""

from __future__ import annotations

import numpy as np

from avkit.estimators.base import Estimator
from avkit.estimators.rounds import replay_steps
from avkit.sim.steps import StepTable


def burn_in(est: Estimator, steps: StepTable, feature: str, chunk: int = 100, min_refits: int = 20,
            max_passes: int = 50) -> int:
    """Replay the traces' recorded outcomes through `est` in engine-step order until `min_refits` refits
    (at most `max_passes` passes); returns the passes made."""
    s, k = steps.request.size, steps.k
    known = (steps.engine_step >= 0).all()
    order = np.argsort(steps.engine_step, kind="stable") if known else np.arange(s)
    eng = steps.engine_step[order] if known else np.arange(s) // 8
    bounds = np.r_[np.flatnonzero(np.r_[True, eng[1:] != eng[:-1]]), s] * k  # [G+1] first slot of each step
    feats = np.nan_to_num(steps.features[feature][order], nan=0.0).ravel()  # [S * K]
    labels = steps.label[order].ravel()  # [S * K] -1 censored
    pos = np.tile(np.arange(k), s)
    refits, passes = 0, 0

    def count(g: int, refit: bool) -> None:
        nonlocal refits
        refits += int(refit)

    while refits < min_refits and passes < max_passes:
        replay_steps(est, feats, pos, labels, bounds, on_round=count, chunk=chunk)
        passes += 1
    return passes
