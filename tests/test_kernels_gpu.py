"""The kernels at real sizes on a GPU (V = 151,936, K = 7, B = 64): correctness only.

Runs the checks of bench/gpu_kernels.py without its timings; `python bench/gpu_check.py --steps kernels` times them.
"""

import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_every_kernel_matches_its_reference_at_real_size():
    pytest.importorskip("triton")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import gpu_check
    import gpu_kernels

    cases = gpu_kernels.run_all(torch.device("cuda"), [64], gpu_check.REAL.vocab, timed=False)
    bad = [(c["kernel"], c["detail"]) for c in cases if not c["correct"]]
    assert not bad, bad
