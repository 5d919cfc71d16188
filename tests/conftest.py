"""Session-wide test setup.

Triton runs kernels on CPU only under its interpreter, and reads TRITON_INTERPRET when triton is
first imported; set it here, before any test module imports torch or triton, so the kernel tests
never skip because another module imported triton first. On a machine with a GPU it stays unset.
"""

import os
import shutil

if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest


@pytest.fixture(scope="module")
def kernels():
    """The Triton kernels (interpreted on CPU), or a skip when triton is missing or was imported early."""
    pytest.importorskip("triton")
    import torch

    from avkit.errors import ConfigError
    from avkit.kernels.dispatch import select_kernels

    try:
        return select_kernels("cuda" if torch.cuda.is_available() else "cpu", backend="triton")
    except ConfigError as e:  # triton was imported earlier in this process without the interpreter
        pytest.skip(str(e))
