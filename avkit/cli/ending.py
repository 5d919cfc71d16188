"""How a command stopped by a signal ends: at once, without the interpreter's teardown.

The teardown's last garbage collection walks every object torch and the models left behind, which takes
seconds on a busy 2-core box (4.6 s of a 5 s SIGTERM bound, measured on `avkit serve` with the tiny test
models). By the time a command returns or unwinds from a signal, its outputs are committed or removed
(`avkit/staged.py`) and a server's side writes are closed, so only the streams and the log need flushing.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def end_process(code: int | str | None) -> NoReturn:
    """Flush stdout, stderr and the log, then exit with `code` (sys.exit's convention) without teardown."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to say
            pass
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


__all__ = ["end_process"]
