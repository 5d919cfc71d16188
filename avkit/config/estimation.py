"""The acceptance estimator and the adaptive verification built on it (docs/estimator.md, docs/budget.md)."""

from __future__ import annotations

from dataclasses import dataclass

from avkit.validate import in_range


@dataclass(frozen=True)
class EstimatorConfig:
    """Online acceptance estimator (docs/estimator.md): p_i = sigmoid(slope * f + intercept_i)."""

    feature: str = "logit_qmax"
    init_slope: float = 0.5
    init_intercept: float = -0.2
    refit_interval: int = 100  # engine steps per refit round
    ridge: float = 1e-3
    damping: float = 50.0  # update scaled by n / (n + damping)

    def __post_init__(self):
        in_range(self, "refit_interval", 1)
        in_range(self, "ridge", 0.0)
        in_range(self, "damping", 0.0)


@dataclass(frozen=True)
class ForgettingConfig:
    """`forgetting_logistic` (estimators/forgetting_logistic.py): the same model as EstimatorConfig's,
    refit from exponentially forgotten curvature, more often while young, faster after a shift."""

    half_life: float = 2000.0  # engine steps after which past evidence weighs half
    young_interval: int = 5  # first round's engine steps; doubles every refit up to EstimatorConfig's
    shift_z: float = 4.0  # |calibration z| of a round above this: a workload shift
    shift_keep: float = 0.2  # share of past evidence kept after a shift
    prior_slots: float = 50.0  # weight of the start coefficients, in pseudo-slots per position

    def __post_init__(self):
        in_range(self, "half_life", 0.0, lo_open=True)
        in_range(self, "young_interval", 1)
        in_range(self, "shift_z", 0.0, lo_open=True)
        in_range(self, "shift_keep", 0.0, 1.0)
        in_range(self, "prior_slots", 0.0, lo_open=True)


@dataclass(frozen=True)
class AdaptiveConfig:
    """Budgeted verification (docs/budget.md): where the confidences and the step costs come from."""

    estimator: str = "online_logistic"  # a name in ESTIMATORS, or "none" (verify everything)
    coefficients: str = ""  # coefficients.json warm start for the estimator ("" = its defaults)
    # the suffix cache's rows (hybrid drafter): their own estimator, warm-started from a file fitted on
    # cache rows (`avkit fit --drafter suffix`; "" = the reference constants, refit from cache rows)
    cache_coefficients: str = ""
    cost: str = ""  # cost table JSON or roofline:GPU:MODEL ("" = DEFAULT_COST_PATH, else CPU roofline)
    history: int = 1000  # refits kept in the coefficient trajectory
    draft_gate: bool = True  # may skip drafting for a step when no draft depth pays at its load (gate.py)
    gate_window: int = 64  # recent drafted request-steps the gate replays its step on
    probe_every: int = 256  # skipped steps in a row before the gate drafts again to re-measure
    resume_margin: float = 0.1  # gate off: resume drafting only when it promises > 10% more tokens/ms
    stop_drafting: bool = True  # an autoregressive drafter stops each request's drafting early (stop.py)
    learn_cost: bool = False  # learn the cost model from the engine's step times (scheduling/learn.py; serve: on)
    cost_probe_every: int = 97  # learning: every this many steps a probe verifies a depth set by the step count

    def __post_init__(self):
        in_range(self, "history", 1)
        in_range(self, "gate_window", 1)
        in_range(self, "probe_every", 1)
        in_range(self, "resume_margin", 0.0)
        in_range(self, "cost_probe_every", 0)


__all__ = ["AdaptiveConfig", "EstimatorConfig", "ForgettingConfig"]
