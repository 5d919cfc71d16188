"""Acceptance estimators behind one Protocol (`base.Estimator`), looked up in `ESTIMATORS`.

  online_logistic     shared slope + per-position intercepts, refit in rounds (vLLM's; the default)
  forgetting_logistic the same model refit from forgotten curvature, sooner while young, faster after a shift
  batch_logistic      the same model fitted to convergence on all slots
  per_position_slope  ablation: a slope per position
  qmax, passthrough   no fit: q_max / a trained head's output used as the probability
  payoff_mlp          HVD payoff predictor (its own module, registered when present)
"""

import importlib

from avkit.estimators import (  # noqa: F401  (registers)
    forgetting_logistic, online_logistic, passthrough, per_position_slope)
from avkit.estimators.base import ESTIMATORS, Estimator, make_estimator, register

try:  # the HVD payoff predictor registers itself when its module exists
    importlib.import_module("avkit.estimators.payoff_mlp")
except ModuleNotFoundError as _e:
    if _e.name != "avkit.estimators.payoff_mlp":
        raise

__all__ = ["ESTIMATORS", "Estimator", "make_estimator", "register"]
