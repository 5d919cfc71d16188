"""Session-wide test setup.

Triton runs kernels on CPU only under its interpreter, and reads TRITON_INTERPRET when triton is
first imported; set it here, before any test module imports torch or triton, so the kernel tests
never skip because another module imported triton first. On a machine with a GPU it stays unset.
"""

import os
import shutil

if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
