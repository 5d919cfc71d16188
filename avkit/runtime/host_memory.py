"""A CPU engine keeps freed host memory mapped, so each step's vocabulary-wide buffers reuse their pages
instead of faulting in fresh ones: glibc's mmap threshold raised to its maximum and no heap trimming, once per
process (Linux/glibc only; AVKIT_KEEP_FREED_MEMORY=0 turns it off). docs/runtime.md has the measurement.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MMAP_THRESHOLD_MAX = 4 * 1024 * 1024 * ctypes.sizeof(ctypes.c_long)  # glibc's cap: 32 MB on 64-bit
TRIM_NEVER = 2**31 - 1  # bytes of free heap top kept before trimming (an int)


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's allocator to keep freed memory (module note); True when it took effect."""
    if os.environ.get("AVKIT_KEEP_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and \
            bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_NEVER))
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): its own policy stays
        return False


__all__ = ["keep_freed_memory"]
