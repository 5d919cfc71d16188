"""Kernel dispatch: one backend chosen once (the Triton hash is tested bit for bit through the rejection kernel)."""

import os

import pytest
import torch

from avkit.errors import ConfigError
from avkit.kernels.dispatch import select_kernels

# On CPU the kernels run in Triton's interpreter, which @triton.jit selects when it decorates:
# the variable must be set before this process first imports triton (nothing above does).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"


def test_reference_backend_on_cpu():
    k = select_kernels("cpu")
    assert k.backend == "torch"
    assert k.confidence.__name__ == "confidence_ref"
    assert select_kernels("cpu", backend="torch").rejection_sample.__name__ == "rejection_sample_ref"


def test_triton_backend():
    pytest.importorskip("triton")
    assert select_kernels(DEVICE, backend="triton").backend == "triton"  # CUDA, or the interpreter on CPU


@pytest.mark.parametrize("name", ["cuda", "ref", ""])  # not a backend; no aliases
def test_unknown_backend_is_an_error(name):
    with pytest.raises(ConfigError, match="kernel backend must be one of"):
        select_kernels("cpu", backend=name)

