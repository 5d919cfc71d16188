"""Frozen configuration dataclasses, one per component; every default lives here once.

Each component receives the narrow config it uses. Validation happens in __post_init__ and
raises ConfigError naming the field and the bad value. The CLI builds its options from these
defaults (``default_of(Cls, "field")``), so the two never drift.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

from avkit.validate import check_choice, check_range

# ---- shared constants (DESIGN.md §3, reference values from vLLM's implementation) ----
DEFAULT_K = 7
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


def default_of(cls, name: str):
    """The dataclass default of one field (for building CLI options from config)."""
    for f in fields(cls):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:  # type: ignore[misc]
                return f.default_factory()  # type: ignore[misc]
    raise KeyError(name)


@dataclass(frozen=True)
class SamplingConfig:
    """How one request samples: temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 0.95
    max_new_tokens: int = 256
    seed: int | None = None

    def __post_init__(self):
        check_range("temperature", self.temperature, 0.0)
        check_range("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        check_range("max_new_tokens", self.max_new_tokens, 1)


@dataclass(frozen=True)
class EstimatorConfig:
    """Online acceptance estimator (DESIGN.md §3): p_i = sigmoid(slope * f + intercept_i)."""

    feature: str = "logit_qmax"
    init_slope: float = 0.5
    init_intercept: float = -0.2
    refit_interval: int = 100  # engine steps per refit round
    ridge: float = 1e-3
    damping: float = 50.0  # update scaled by n / (n + damping)

    def __post_init__(self):
        check_range("refit_interval", self.refit_interval, 1)
        check_range("ridge", self.ridge, 0.0)
        check_range("damping", self.damping, 0.0)


# ---- runtime (issue: runtime core) ----

# ---- record (issue: record) ----

# ---- adaptive verification / simulate / profile ----

# ---- hybrid verified decoding ----

# ---- serve ----

# ---- report ----


__all__ = ["DEFAULT_K", "SamplingConfig", "EstimatorConfig", "default_of", "check_choice"]
