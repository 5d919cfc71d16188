"""JSON that every parser reads: NaN and ±inf become null (Python's json writes bare `NaN`, which
is not JSON), numpy scalars become Python numbers.

Every JSON file avkit writes (coefficients.json, scores.json, hvd_metrics.json, cost tables) goes
through `json_safe` before `json.dumps(..., allow_nan=False)`, so a stray NaN fails loudly here
instead of producing a file other tools reject.
"""

from __future__ import annotations

import json
import math

import numpy as np


def json_safe(x):
    """A copy of `x` with non-finite floats as None and numpy scalars/arrays as Python values.

    Examples
    --------
    >>> json_safe({"auc": float("nan"), "n": np.int64(3), "xs": [1.5, float("inf")]})
    {'auc': None, 'n': 3, 'xs': [1.5, None]}
    """
    if isinstance(x, np.ndarray):
        x = x.tolist()
    elif isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def dumps(obj, **kw) -> str:
    """`json.dumps` of `json_safe(obj)`; never writes NaN."""
    return json.dumps(json_safe(obj), allow_nan=False, **kw)


__all__ = ["dumps", "json_safe"]
