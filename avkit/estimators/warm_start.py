"""A warm start for the temperature being served, from fits recorded at other temperatures (docs/estimator.md).

Features are read from the draft logits divided by the served temperature (logit(q_max) at T = 0.3 is
about three times its value at T = 1), so a fit does not carry over to another temperature: warm-started
from T in {0, 0.6, 0.8, 1}, every estimator over-predicts a T = 0.3 trace (held-out ECE 0.05-0.12). The
rule keeps the warm start where it helps and backs off where it cannot be trusted:

  nearest   the fit(s) at the recorded temperature closest to the served one (gap = |T - T_fit|;
            fits at two equally near temperatures are averaged, weighted by their observations)
  shrink    lambda = exp(-gap / tau); start = lambda * nearest + (1 - lambda) * reference constants
            (EstimatorConfig's init_slope / init_intercept, vLLM's omega 0.5, beta -0.2)
            gap 0: the served temperature's own fit, whatever tau; tau = 0: the reference constants at
            any gap > 0; tau = inf: the nearest fit at any gap

tau is picked by bench/estimators.py's inner leave-one-temperature-out on its training traces, never on
the trace it scores. Every input is a fitted coefficient and a temperature: verification stays lossless.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from avkit.config import EstimatorConfig
from avkit.errors import ConfigError


@dataclass(frozen=True)
class TemperatureFit:
    """A shared-slope fit (an `online_logistic` / `batch_logistic` state) and the temperature of its slots."""

    temperature: float  # the sampling temperature it was recorded at (0 = greedy)
    state: dict[str, Any]  # slope, intercepts [K], num_positions, feature; observations [K] optional


def shrink_weight(gap: float, tau: float) -> float:
    """lambda = exp(-gap / tau): 1 at gap 0 (any tau), 0 for gap > 0 at tau = 0, 1 at tau = inf."""
    if gap == 0:
        return 1.0
    return 0.0 if tau == 0 else math.exp(-gap / tau)


def _check(fits: Sequence[TemperatureFit], temperature: float, tau: float) -> None:
    if not fits:
        raise ConfigError("warm start: no fits given (one per recorded temperature)")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"warm start: temperature must be a finite number >= 0, got {temperature}")
    if math.isnan(tau) or tau < 0:
        raise ConfigError(f"warm start: tau must be >= 0 (inf allowed), got {tau}")
    first = fits[0].state
    for fit in fits:
        for key in ("num_positions", "feature"):
            if fit.state.get(key) != first.get(key):
                raise ConfigError(f"warm start: fit at T={fit.temperature:g} has {key} {fit.state.get(key)!r}, "
                                  f"the fit at T={fits[0].temperature:g} has {first.get(key)!r}")


def temperature_warm_start(fits: Sequence[TemperatureFit], temperature: float, tau: float,
                           config: EstimatorConfig | None = None) -> dict[str, Any]:
    """The start state at `temperature` (loadable by online_logistic and forgetting_logistic).

    Examples
    --------
    >>> fit = TemperatureFit(1.0, {"num_positions": 2, "feature": "logit_qmax", "slope": 0.7,
    ...                             "intercepts": [0.6, 0.8], "observations": [10, 8]})
    >>> s = temperature_warm_start([fit], 1.0, tau=0.1)
    >>> s["slope"], s["intercepts"]
    (0.7, [0.6, 0.8])
    >>> s = temperature_warm_start([fit], 0.3, tau=0.0)
    >>> s["slope"], s["intercepts"]
    (0.5, [-0.2, -0.2])
    """
    _check(fits, temperature, tau)
    config = config or EstimatorConfig()
    gaps = np.array([abs(f.temperature - temperature) for f in fits])  # [F]
    nearest = [f for f, g in zip(fits, gaps) if g <= gaps.min() + 1e-9]
    k = int(nearest[0].state["num_positions"])
    obs = np.array([np.sum(f.state.get("observations", 0)) for f in nearest], dtype=np.float64)  # [n]
    w = obs / obs.sum() if obs.sum() > 0 else np.full(len(nearest), 1.0 / len(nearest))  # [n]
    slope = float(w @ np.array([float(f.state["slope"]) for f in nearest]))
    intercepts = w @ np.array([np.asarray(f.state["intercepts"], dtype=np.float64) for f in nearest])  # [K]
    observations = w @ np.array([np.broadcast_to(f.state.get("observations", 0), k) for f in nearest])  # [K]
    lam = shrink_weight(float(gaps.min()), tau)
    if lam < 1.0:  # lam = 1 keeps the fit bit-identical
        slope = lam * slope + (1.0 - lam) * config.init_slope
        intercepts = lam * intercepts + (1.0 - lam) * config.init_intercept
    return {"name": "online_logistic", "feature": nearest[0].state.get("feature", config.feature),
            "num_positions": k, "slope": slope, "intercepts": intercepts.tolist(),
            "observations": np.rint(lam * observations).astype(int).tolist(), "rounds": 0, "rejected": 0}
