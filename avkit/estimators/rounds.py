"""The online-round driver of every replay: `avkit fit`, the simulator and its burn-in.

Live, each step's drafts are predicted with the current coefficients, verified, and its observed slots
fed to `estimator.update` (scheduling/adaptive.py), which refits after exactly `refit_interval` engine
steps. The coefficients cannot change before a round's last step, so a replay predicts all
`steps_to_refit` steps of a round in one `predict` call, lets the caller decide them, and feeds them in
one `update(..., steps=n)`: the refit falls on the same step, the predictions are those of a
step-by-step live loop.

  step bounds  [G + 1] first row of each engine step in the flat slot arrays (empty steps allowed:
               a step whose slots were all censored still counts, as live)
  decide       (conf [n], g0, g1) -> (observed [n] bool, drafted [g1 - g0] bool): the rows of
               steps [g0, g1) that carry a label, and the steps that drafted (only those count)
  run end      a replay stops mid-round when the trace ends: the open round is dropped (no refit
               on a partial round; live, a server that stops loses it too)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from avkit.estimators.base import Estimator

Decide = Callable[[np.ndarray, int, int], tuple[np.ndarray, np.ndarray]]
OnRound = Callable[[int, bool], None]  # (last engine step of the call, refitted)


def replay_steps(est: Estimator, features: np.ndarray, positions: np.ndarray, labels: np.ndarray,
                 bounds: np.ndarray, decide: Decide | None = None, on_round: OnRound | None = None,
                 chunk: int = 100) -> np.ndarray:
    """Drive `est` through engine steps [0, G) of one run, as live; -> predictions made when drafting [N].
    labels [N]: 1 accepted, 0 rejected, -1 censored. `decide=None` replays the recorded schedule (every
    labelled row observed, every step drafted); estimators without rounds are fed `chunk` steps a call."""
    preds = np.empty(len(features))  # [N]
    groups, g0 = bounds.size - 1, 0
    while g0 < groups:
        g1 = min(groups, g0 + max(1, int(getattr(est, "steps_to_refit", chunk))))
        r0, r1 = int(bounds[g0]), int(bounds[g1])
        conf = preds[r0:r1] = est.predict(features[r0:r1], positions[r0:r1])  # [n] one call per round
        if decide is None:
            observed, drafted = labels[r0:r1] >= 0, g1 - g0
        else:
            observed, stepped = decide(conf, g0, g1)
            drafted = int(np.count_nonzero(stepped))
        refit = est.update(features[r0:r1][observed], positions[r0:r1][observed], conf[observed],
                           (labels[r0:r1][observed] == 1).astype(np.float64), steps=drafted)
        if on_round is not None:
            on_round(g1 - 1, bool(refit))
        g0 = g1
    if hasattr(est, "reset_round"):
        est.reset_round()
    return preds
