"""What the `vllm`-marked tests share: vLLM's interpreter, and the rule for when it is absent.

The tests run vLLM 0.32 from its own venv: `$AVKIT_VLLM_PYTHON`, else `.venv-vllm/bin/python` at the repository
root (`.ci/vllm` builds one). Without it they skip, unless `AVKIT_VLLM_REQUIRED=1` (set by `.ci/vllm`, where a
missing venv is a broken CI, not a reason to pass): then they fail.
"""

from __future__ import annotations

import os
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
