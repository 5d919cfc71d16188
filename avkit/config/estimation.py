"""The acceptance estimator and the adaptive verification built on it (docs/estimator.md, docs/budget.md)."""

from __future__ import annotations

from dataclasses import dataclass

from avkit.config.fields import Checked, checked


@dataclass(frozen=True)
class EstimatorConfig(Checked):
    """Online acceptance estimator (docs/estimator.md): p_i = sigmoid(slope * f + intercept_i)."""

    feature: str = "logit_qmax"
    init_slope: float = 0.5
    init_intercept: float = -0.2
    refit_interval: int = checked(100, 1)  # engine steps per refit round
    ridge: float = checked(1e-3, 0.0)
    damping: float = checked(50.0, 0.0)  # update scaled by n / (n + damping)


@dataclass(frozen=True)
class ForgettingConfig(Checked):
    """`forgetting_logistic` (estimators/forgetting_logistic.py): the same model as EstimatorConfig's,
    refit from exponentially forgotten curvature, more often while young, faster after a shift."""

    half_life: float = checked(2000.0, 0.0, lo_open=True)  # engine steps after which past evidence weighs half
    young_interval: int = checked(5, 1)  # first round's engine steps; doubles every refit up to EstimatorConfig's
    shift_z: float = checked(4.0, 0.0, lo_open=True)  # |calibration z| of a round above this: a workload shift
    shift_keep: float = checked(0.2, 0.0, 1.0)  # share of past evidence kept after a shift
    # weight of the start coefficients, pseudo-slots/position
    prior_slots: float = checked(50.0, 0.0, lo_open=True)


@dataclass(frozen=True)
class AdaptiveConfig(Checked):
    """Budgeted verification (docs/budget.md): where the confidences and the step costs come from."""

    estimator: str = "online_logistic"  # a name in ESTIMATORS, or "none" (verify everything)
    coefficients: str = ""  # coefficients.json warm start for the estimator ("" = its defaults)
    # the suffix cache's rows (hybrid drafter): their own estimator, warm-started from a file fitted on
    # cache rows (`avkit fit --drafter suffix`; "" = the reference constants, refit from cache rows)
    cache_coefficients: str = ""
    cost: str = ""  # cost table JSON or roofline:GPU:MODEL ("" = DEFAULT_COST_PATH, else CPU roofline)
    history: int = checked(1000, 1)  # refits kept in the coefficient trajectory
    draft_gate: bool = True  # may skip drafting for a step when no draft depth pays at its load (gate.py)
    gate_window: int = checked(64, 1)  # recent drafted request-steps the gate replays its step on
    probe_every: int = checked(256, 1)  # skipped steps in a row before the gate drafts again to re-measure
    resume_margin: float = checked(0.1, 0.0)  # gate off: resume drafting only when it promises > 10% more tok/ms
    learn_cost: bool = False  # learn the cost model from the engine's step times (scheduling/learn.py; serve: on)
    # learning: every this many steps a probe verifies a depth set by the step count
    cost_probe_every: int = checked(97, 0)


__all__ = ["AdaptiveConfig", "EstimatorConfig", "ForgettingConfig"]
