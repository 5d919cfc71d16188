"""The kernels at real sizes on a GPU (V = 151,936, K = 7, B = 64): correctness only.

Runs the checks of bench/gpu_kernels.py without its timings; `python bench/gpu_kernels.py` times them.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_every_kernel_matches_its_reference_at_real_size():
    pytest.importorskip("triton")
    path = Path(__file__).resolve().parents[1] / "bench" / "gpu_kernels.py"
    spec = importlib.util.spec_from_file_location("gpu_kernels", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cases = bench.run_all(torch.device("cuda"), [64], bench.V, timed=False)
    bad = [(c["kernel"], c["detail"]) for c in cases if not c["correct"]]
    assert not bad, bad
