"""bench/estimators.py's blend_platt: a blend of two candidates' logits through the online Platt map.

    blend:  p = sigmoid(w * logit(p_a) + (1 - w) * logit(p_b))            w in [0, 1]
    platt:  p' = sigmoid(a * logit(p) + b)    refit online from the served trace's own past labels

The map and the blend are avkit/estimators/platt.py's (`online_platt`, `blend`; `forgetting_platt` deploys the
map on one estimator). Here: the weight w and the map's prior precision lam, chosen by an inner LOTO on the
training traces (`choose`), each inner trace's base predictions made as the outer one's are, and `platt_fit`,
the batch MAP fit of the map (the diagnosis' hindsight map, and the online map's oracle in the tests).
"""

from __future__ import annotations

import numpy as np

from avkit.estimators.platt import PlattMap, blend, online_platt
from avkit.metrics import log_loss

WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the blend's weight on the first candidate
LAMS = (10.0, 100.0, 1000.0, 10000.0, np.inf)  # the Platt layer's prior precisions (a round's sum w z^2: ~1e2-1e3)


def platt_fit(z: np.ndarray, y: np.ndarray, lam: float = 0.0, iters: int = 50, tol: float = 1e-10) -> np.ndarray:
    """[2] (a, b) maximising sum log-likelihood of y ~ sigmoid(a z + b) - lam / 2 |(a, b) - (1, 0)|^2: the online
    map's round (damped Newton) on every slot at once."""
    m = PlattMap(lam)
    m.add(z, y)
    m.step(iters, tol)
    return m.theta


def choose(inner: list[tuple[np.ndarray, ...]]) -> tuple[float, float, float]:
    """-> (w, lam, lam_a) over the inner held-out traces, each (labels, p_a, p_b, row_step): w of least mean
    log-loss for the blend alone, then the map's prior lam of least mean log-loss on the blend at that w, and
    lam_a the same on p_a alone (w = 1: forgetting_platt)."""
    def mean_loss(w, lam):
        return np.mean([log_loss(y, online_platt(blend(a, b, w), y, s, lam)) for y, a, b, s in inner])

    w = min(WEIGHTS, key=lambda v: mean_loss(v, np.inf))
    return w, min(LAMS, key=lambda v: mean_loss(w, v)), min(LAMS, key=lambda v: mean_loss(1.0, v))

