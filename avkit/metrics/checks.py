"""The one validator for binary metric inputs: messages name the argument and show the bad value."""

from __future__ import annotations

from avkit.errors import DataError
from avkit.validate import as_1d, check_labels, check_probs, check_same_length


class UndefinedMetricWarning(UserWarning):
    """The metric is undefined on this input (e.g. AUC with one class); nan is returned."""


def check_binary_inputs(labels, values, sample_weight=None, *, name: str, probabilities: bool):
    """-> (labels [N] float64 in {0,1}, values [N] float64, weights [N] float64 or None)."""
    y = check_labels("labels", labels)
    v = check_probs(name, values) if probabilities else as_1d(name, values)
    w = None
    if sample_weight is not None:
        w = as_1d("sample_weight", sample_weight)
        if w.min() < 0:
            raise DataError(f"sample_weight must be >= 0, got {w.min()}")
        check_same_length(labels=y, **{name: v}, sample_weight=w)
        if w.sum() <= 0:
            raise DataError(f"sample_weight must have a positive sum, got {w.sum()}")
    else:
        check_same_length(labels=y, **{name: v})
    return y, v, w
