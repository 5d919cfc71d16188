"""Online estimators inside a replay: predict a round at once, decide it, feed one update per engine step.

Glossary:
  round     up to `chunk` engine steps predicted with one `predict` call; the estimator's coefficients
            only change when `update` reports a refit, and then the rest of the round is re-predicted,
            so the predictions are exactly those a step-by-step live loop would make
  burn-in   the traces replayed in recorded engine-step order, labels as recorded, until the estimator
            has completed `min_refits` refit rounds (small trace sets are replayed several times): the
            state a live estimator reaches after serving such traffic for a while. The simulator starts
            adaptive runs from it unless a coefficients file is given.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from avkit.estimators.base import Estimator
from avkit.sim.steps import StepTable


def run_rounds(est: Estimator, feats: np.ndarray, labels: np.ndarray, bounds: np.ndarray,
               decide: Callable[[np.ndarray, int, int], tuple[np.ndarray, np.ndarray]], chunk: int = 100) -> int:
    """Drive `est` through steps [0, G): `decide(conf [rows, K], g0, g1)` acts on the rows of steps [g0, g1)
    and returns which slots were observed ([rows, K] bool) and which steps drafted ([g1-g0] bool: only
    those feed the estimator an update, as live); labels [S, K] (1 accepted) give the outcomes.

    feats: [S, K] the estimator's feature; bounds: [G+1] first row of each step. Returns the refits done.
    """
    refits = 0
    k = feats.shape[1]
    pos = np.broadcast_to(np.arange(k), feats.shape)  # [S, K]
    groups, g0 = bounds.size - 1, 0
    while g0 < groups:
        g1 = min(groups, g0 + chunk)
        r0, r1 = bounds[g0], bounds[g1]
        conf = np.asarray(est.predict(feats[r0:r1].ravel(), pos[r0:r1].ravel())).reshape(-1, k)  # [rows, K]
        observed, stepped = decide(conf, g0, g1)
        next_g = g1
        for g in (np.flatnonzero(stepped) + g0).tolist():  # one update per drafted engine step, as live
            a, b = bounds[g] - r0, bounds[g + 1] - r0
            o = observed[a:b]
            if est.update(feats[r0 + a:r0 + b][o], pos[r0 + a:r0 + b][o], conf[a:b][o],
                          (labels[r0 + a:r0 + b][o] == 1).astype(np.float64)):
                next_g = g + 1  # coefficients changed: the rest of the round re-predicts
                refits += 1
                break
        g0 = next_g
    return refits


def burn_in(est: Estimator, steps: StepTable, feature: str, chunk: int = 100, min_refits: int = 20,
            max_passes: int = 50) -> int:
    """Replay the traces' recorded outcomes through `est` in engine-step order (8 rows a step if unknown)
    until `min_refits` refits (at most `max_passes` passes); returns the passes made."""
    s = steps.request.size
    known = (steps.engine_step >= 0).all()
    order = np.argsort(steps.engine_step, kind="stable") if known else np.arange(s)
    eng = steps.engine_step[order] if known else np.arange(s) // 8
    bounds = np.r_[np.flatnonzero(np.r_[True, eng[1:] != eng[:-1]]), s]  # [G+1]
    feats = np.nan_to_num(steps.features[feature][order], nan=0.0)
    labels = steps.label[order]
    refits, passes = 0, 0
    while refits < min_refits and passes < max_passes:
        refits += run_rounds(est, feats, labels, bounds,
                             lambda conf, g0, g1: (labels[bounds[g0]:bounds[g1]] >= 0, np.ones(g1 - g0, bool)), chunk)
        passes += 1
    return passes
