"""Acceptance metrics, named as sklearn's: `auc` (higher is better), `log_loss` and `ece` (lower is better).
`METRICS` classifies every metric by its properties; the invariance tests are driven by it
(a metric missing from it fails the tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from avkit.metrics.calibration import UndefinedMetricWarning, ece, log_loss
from avkit.metrics.ranking import auc
from avkit.metrics.table import score_table


@dataclass(frozen=True)
class MetricSpec:
    fn: Callable[..., float]
    higher_is_better: bool
    needs_probabilities: bool  # inputs must lie in [0, 1] (else any finite score)
    monotone_invariant: bool  # unchanged by a strictly increasing transform of the scores


METRICS: dict[str, MetricSpec] = {
    "auc": MetricSpec(auc, higher_is_better=True, needs_probabilities=False, monotone_invariant=True),
    "log_loss": MetricSpec(log_loss, higher_is_better=False, needs_probabilities=True, monotone_invariant=False),
    "ece": MetricSpec(ece, higher_is_better=False, needs_probabilities=True, monotone_invariant=False),
}

__all__ = ["METRICS", "MetricSpec", "UndefinedMetricWarning", "auc", "ece", "log_loss", "score_table"]
