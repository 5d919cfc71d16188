"""Kernel dispatch, decided once: a runtime keeps `select_kernels(device)` and calls `kernels.confidence(...)`
etc. with no per-call branching. Both backends share one signature per kernel, so the choice changes speed,
never results (integers bit-identical; floats to the tolerances of tests/test_kernels_*.py). On a CPU the Triton
backend needs TRITON_INTERPRET=1 set before triton is first imported (@triton.jit reads it when it decorates).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import NamedTuple

import torch

from avkit.config.engine import KERNEL_BACKENDS
from avkit.errors import ConfigError
from avkit.kernels.allocation_ref import allocate_ref
from avkit.kernels.confidence_ref import confidence_ref
from avkit.kernels.irls_stats_ref import irls_stats_ref
from avkit.kernels.rejection_ref import rejection_sample_ref
from avkit.validate import check_choice


class Kernels(NamedTuple):
    """The hot-path operations of one backend, each with its ``*_ref`` function's signature."""

    backend: str  # "torch" or "triton"
    confidence: Callable  # -> Confidence
    rejection_sample: Callable  # -> RejectionResult
    irls_stats: Callable  # -> IrlsStats
    allocate: Callable  # -> Allocation


def select_kernels(device: str | torch.device = "cpu", backend: str = "auto") -> Kernels:
    """The kernel set for tensors on `device`. backend: "auto" (Triton on CUDA when installed, else torch), "torch"
    or "triton" (EngineConfig.kernels, `--kernels`)."""
    backend = check_choice("kernel backend", backend, KERNEL_BACKENDS)
    dev = torch.device(device)
    has_triton = importlib.util.find_spec("triton") is not None
    if backend == "torch" or (backend == "auto" and not (dev.type == "cuda" and has_triton)):
        return Kernels("torch", confidence_ref, rejection_sample_ref, irls_stats_ref, allocate_ref)
    if not has_triton:
        raise ConfigError("kernel backend 'triton': the triton package is not installed")
    import triton.language as tl  # lazy: triton (absent on CPU-only installs; the modules below import it)
    from triton.runtime.interpreter import InterpretedFunction  # lazy: triton

    if dev.type != "cuda" and not isinstance(tl.zeros, InterpretedFunction):  # compiled, not interpreted
        raise ConfigError(f"kernel backend 'triton' on device {dev}: needs a CUDA device, or "
                          "TRITON_INTERPRET=1 set before triton is first imported")
    from avkit.kernels.allocation import allocate_triton  # lazy: triton
    from avkit.kernels.confidence import confidence_triton  # lazy: triton
    from avkit.kernels.irls_stats import irls_stats_triton  # lazy: triton
    from avkit.kernels.rejection import rejection_sample_triton  # lazy: triton

    return Kernels("triton", confidence_triton, rejection_sample_triton, irls_stats_triton, allocate_triton)
