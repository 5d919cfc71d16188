"""Where the models run: `device` and `dtype` names ("auto" included) resolved once, at load time.

  auto device  cuda when torch sees a GPU, else cpu
  auto dtype   bfloat16 on a GPU (what serving runs), float32 on a CPU; bfloat16 on CPU is ~3x faster
               on AVX512-BF16 cores and is what the shipped traces were recorded with (`--dtype bfloat16`)
"""

from __future__ import annotations

import torch

from avkit.errors import ConfigError
from avkit.validate import check_placement


def placement(device: str = "auto", dtype: str = "auto") -> tuple[torch.device, torch.dtype]:
    """(torch.device, torch.dtype) from names; an explicit cuda device on a machine without one is an error."""
    check_placement(device, dtype)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: torch sees no CUDA GPU on this machine (use --device cpu)")
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "bfloat16"
    return torch.device(device), getattr(torch, dtype)
