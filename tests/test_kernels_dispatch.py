"""Kernel dispatch and the Triton RNG: one backend chosen once; the Triton hash equals the torch one."""

import os

import pytest
import torch

from avkit.errors import ConfigError
from avkit.kernels import rng
from avkit.kernels.dispatch import select_kernels

# On CPU the kernels run in Triton's interpreter, which @triton.jit selects when it decorates:
# the variable must be set before this process first imports triton (nothing above does).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"


def test_reference_backend_on_cpu(monkeypatch):
    monkeypatch.delenv("AVKIT_KERNELS", raising=False)
    k = select_kernels("cpu")
    assert k.backend == "torch"
    assert k.confidence.__name__ == "confidence_ref"
    assert select_kernels("cpu", backend="torch").rejection_sample.__name__ == "rejection_sample_ref"
    assert select_kernels("cpu", backend="ref").backend == "torch"  # the old name, read as torch


def test_backend_override_and_errors(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("AVKIT_KERNELS", "triton")
    assert select_kernels(DEVICE).backend == "triton"  # CUDA, or the interpreter on CPU
    with pytest.raises(ConfigError, match="kernel backend must be one of"):
        select_kernels("cpu", backend="cuda")


def test_triton_uniform_is_bit_identical():
    pytest.importorskip("triton")
    from avkit.kernels.rng_triton import uniform_triton

    g = torch.Generator().manual_seed(0)
    n = 3000
    seed = torch.randint(-2**62, 2**62, (n,), generator=g)  # beyond 32 bits: low words used
    request = torch.randint(0, 2**40, (n,), generator=g)
    position = torch.randint(0, 2**20, (n,), generator=g)
    index = torch.randint(0, 152_000, (n,), generator=g)
    for stream in (rng.STREAM_ACCEPT, rng.STREAM_SAMPLE):
        got = uniform_triton(*(t.to(DEVICE) for t in (seed, request, position)), stream, index.to(DEVICE))
        want = rng.uniform(seed, request, position, stream, index)
        assert torch.equal(got.cpu(), want)
    assert 0.0 < float(want.min()) and float(want.max()) < 1.0
