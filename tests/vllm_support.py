"""What the `vllm`-marked tests share: vLLM's interpreter, and the rule for when it is absent.

The tests run vLLM 0.32 from its own venv: `$AVKIT_VLLM_PYTHON`, else `.venv-vllm/bin/python` at the repository
root (`.ci/vllm` builds one). Without it they skip, unless `AVKIT_VLLM_REQUIRED=1` (set by `.ci/vllm`, where a
missing venv is a broken CI, not a reason to pass): then they fail. `write_tiny_pair` writes the pair they serve.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# absolute (not resolved: the venv's python is a symlink), so a test may run it from another directory
VLLM_PYTHON = Path(os.path.abspath(os.environ.get("AVKIT_VLLM_PYTHON",
                                                  Path(__file__).parents[1] / ".venv-vllm/bin/python")))


def need_vllm() -> Path:
    """vLLM's Python, or a skip (a failure under AVKIT_VLLM_REQUIRED=1) when it is not there."""
    if not VLLM_PYTHON.is_file():
        why = f"no vLLM venv at {VLLM_PYTHON} (set AVKIT_VLLM_PYTHON)"
        if os.environ.get("AVKIT_VLLM_REQUIRED", "0") != "0":
            pytest.fail(why)
        pytest.skip(why)
    return VLLM_PYTHON


def vllm_env() -> dict[str, str]:
    """The environment for a script of vLLM's alone under its Python: nothing of avkit's on PYTHONPATH, and not
    the TRITON_INTERPRET conftest sets for avkit's own kernels."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}


def write_tiny_pair(root, noise: float = 0.05) -> tuple[Path, Path]:
    """A tiny Qwen2 target with peaked logits and a draft = target + `noise` x std Gaussian noise on every
    matrix (seeded), under `root`/target and `root`/draft: some drafts are accepted, some rejected."""
    import torch
    from safetensors.torch import load_file, save_file

    from avkit.models.testing import write_tiny_model

    root = Path(root)
    target = write_tiny_model(root / "target", vocab=512, seed=0, hidden=128, heads=2, kv_heads=1,
                              intermediate=256, init_std=0.5)
    draft = root / "draft"
    shutil.copytree(target, draft, dirs_exist_ok=True)
    g = torch.Generator().manual_seed(1)
    sd = load_file(str(target / "model.safetensors"))
    sd = {k: (v + noise * v.std() * torch.randn(v.shape, generator=g)).contiguous() if v.dim() > 1 else v
          for k, v in sd.items()}
    save_file(sd, str(draft / "model.safetensors"), metadata={"format": "pt"})
    return target, draft
