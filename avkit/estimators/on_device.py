"""An estimator's coefficients on the engine's device, updated in place by every refit.

The live step predicts on the device (no numpy round trip) and the confidence kernel reads the
slope and intercepts as tensors, so nothing the step computes waits for the host. The estimator
keeps its float64 numpy coefficients for fits and the simulator; after each change (a refit, a
warm start) `refresh()` copies them into the same device tensors (a host-to-device copy: the
device never waits on the host, and kernels holding the tensors see the new values).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


class DeviceCoefficients:
    """name -> tensor mirrors of `arrays()` per (device, dtype), created on first use."""

    def __init__(self, arrays: Callable[[], dict[str, np.ndarray]]):
        self._arrays = arrays
        self._mirrors: dict[tuple[torch.device, torch.dtype], dict[str, torch.Tensor]] = {}

    def on(self, device, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
        key = (torch.device(device), dtype)
        if key not in self._mirrors:
            self._mirrors[key] = {n: torch.as_tensor(np.atleast_1d(a), dtype=dtype).to(key[0])
                                  for n, a in self._arrays().items()}
        return self._mirrors[key]

    def refresh(self) -> None:
        """Copy the current host coefficients into every mirror, in place."""
        arrays = self._arrays()
        for mirror in self._mirrors.values():
            for n, t in mirror.items():
                t.copy_(torch.as_tensor(np.atleast_1d(arrays[n]), dtype=t.dtype), non_blocking=True)


def sigmoid_torch(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (1.0 + torch.tanh(0.5 * x))  # the numpy path's overflow-free logistic, term for term


__all__ = ["DeviceCoefficients", "sigmoid_torch"]
