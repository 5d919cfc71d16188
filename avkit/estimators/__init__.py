"""Acceptance estimators behind one Protocol (`base.Estimator`), looked up in `ESTIMATORS`.

  online_logistic     shared slope + per-position intercepts, refit in rounds (vLLM's; the default)
  forgetting_logistic the same model refit from forgotten curvature, sooner while young, faster after a shift
  forgetting_platt    forgetting_logistic's logit through an online Platt map refit from the served labels
  batch_logistic      the same model fitted to convergence on all slots
  per_position_slope  ablation: a slope per position (online_logistic.py)
  qmax, passthrough   no fit: q_max / a trained head's output used as the probability

Each entry of `ESTIMATORS` is imported the first time its name is looked up (avkit/registry.py), so
importing this package imports none of them. The HVD payoff predictor is not an acceptance estimator:
it lives in avkit/hvd/payoff_mlp.py.
"""

from avkit.estimators.base import ESTIMATORS, Estimator, make_estimator, register

__all__ = ["ESTIMATORS", "Estimator", "make_estimator", "register"]
