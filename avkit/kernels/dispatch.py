"""Kernel dispatch: Triton on CUDA devices, the torch references elsewhere, decided once.

A runtime calls `select_kernels(device)` when it is built and keeps the returned `Kernels`; the
hot path then calls `kernels.confidence(...)` etc. with no per-call branching. Both backends
share one signature per kernel, so the choice changes speed, never results (integer outputs are
bit-identical; floats agree to the tolerances stated in tests/test_kernels_*.py).
Override: `backend="torch" | "triton"` (EngineConfig.kernels, `--kernels` of serve and record) or
the AVKIT_KERNELS environment variable ("ref" is read as "torch"). On a CPU the Triton backend
needs the interpreter: TRITON_INTERPRET=1 in the environment before the process first imports
triton (how tests/test_kernels_*.py and tests/test_engine_kernels.py run the kernels; small grids,
big blocks keep it fast enough for a CI test with tiny models).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from avkit.errors import ConfigError
from avkit.kernels.allocation_ref import allocate_ref
from avkit.kernels.confidence_ref import confidence_ref
from avkit.kernels.irls_stats_ref import irls_stats_ref
from avkit.kernels.rejection_ref import rejection_sample_ref
from avkit.validate import check_choice

BACKENDS = ("auto", "torch", "triton")
ENV_VAR = "AVKIT_KERNELS"


@dataclass(frozen=True)
class Kernels:
    """The four hot-path operations of one backend (signatures: see each *_ref function)."""

    backend: str  # "torch" or "triton"
    confidence: Callable  # confidence_ref signature -> Confidence
    rejection_sample: Callable  # rejection_sample_ref signature -> RejectionResult
    irls_stats: Callable  # irls_stats_ref signature -> IrlsStats
    allocate: Callable  # allocate_ref signature -> Allocation


def _reference_kernels() -> Kernels:
    return Kernels("torch", confidence_ref, rejection_sample_ref, irls_stats_ref, allocate_ref)


def _interpreted() -> bool:
    """Whether triton was imported under TRITON_INTERPRET=1. @triton.jit reads the variable when
    it decorates, so it must be set before the first `import triton` in the process (triton's own
    library functions are decorated then); setting it later leaves compiled kernels."""
    import triton.language as tl  # lazy: triton (absent on CPU-only installs)
    from triton.runtime.interpreter import InterpretedFunction  # lazy: triton

    return isinstance(tl.zeros, InterpretedFunction)


def _triton_kernels() -> Kernels:
    # lazy: triton (these modules import it at their top; absent on CPU-only installs)
    from avkit.kernels.allocation import allocate_triton
    from avkit.kernels.confidence import confidence_triton  # lazy: triton
    from avkit.kernels.irls_stats import irls_stats_triton  # lazy: triton
    from avkit.kernels.rejection import rejection_sample_triton  # lazy: triton

    return Kernels("triton", confidence_triton, rejection_sample_triton, irls_stats_triton, allocate_triton)


_LOADERS: dict[str, Callable[[], Kernels]] = {"torch": _reference_kernels, "triton": _triton_kernels}


def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def select_kernels(device: str | torch.device = "cpu", backend: str | None = None) -> Kernels:
    """The kernel set for tensors on `device`.

    backend: "auto" (default; Triton on CUDA when installed, the torch references otherwise),
    "torch" or "triton"; None reads AVKIT_KERNELS (default "auto").
    """
    backend = backend or os.environ.get(ENV_VAR, "auto")
    backend = check_choice("kernel backend", "torch" if backend == "ref" else backend, BACKENDS)
    dev = torch.device(device)
    if backend == "auto":
        backend = "triton" if dev.type == "cuda" and _triton_available() else "torch"
    if backend == "triton":
        if not _triton_available():
            raise ConfigError("kernel backend 'triton': the triton package is not installed")
        if dev.type != "cuda" and not _interpreted():
            raise ConfigError(f"kernel backend 'triton' on device {dev}: needs a CUDA device, or "
                              "TRITON_INTERPRET=1 set before triton is first imported")
    return _LOADERS[backend]()


__all__ = ["BACKENDS", "ENV_VAR", "Kernels", "select_kernels"]
