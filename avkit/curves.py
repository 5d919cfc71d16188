"""Measured cost curves: a few points, piecewise-linear between them, the last segment's slope beyond
(one lookup for the step cost tables of `avkit.scheduling.cost` and the HVD cost model)."""

from __future__ import annotations

import numpy as np


def interp_curve(x: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Piecewise-linear in the grid `xs` -> `ys`, last-segment slope beyond it, first value below it."""
    x = np.asarray(x, dtype=np.float64)
    y = np.interp(x, xs, ys)
    if xs.size > 1:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        y = np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), y)
    return y


__all__ = ["interp_curve"]
