"""Host memory for a CPU engine: keep freed buffers mapped, so a step reuses pages instead of faulting in new ones.

Every step allocates and frees a few vocabulary-wide buffers (the verify logits and probabilities, the draft
probabilities: [B, 1 + k, 151,936] is 58 MB in float32 at B = 16, k = 5). glibc serves allocations above its
mmap threshold (128 KB, raised dynamically as large blocks are freed) with a fresh mapping and returns freed
heap tops to the OS, so the next step's buffer is faulted in page by page and zeroed by the kernel again:
~24,000 minor page faults per step on the 2-core AVX2 box at c16, K = 5, T = 1. `keep_freed_memory` raises
the mmap threshold to glibc's maximum (32 MB on 64-bit) and stops trimming the heap, once per process: the
same step then faults ~7,000 pages and spends 49.0 instead of 83.3 ms outside the forwards (44.7 vs 70.1 at
T = 0; docs/runtime.md). The price: freed memory stays with the process (its peak), as a serving engine's
buffers would anyway. Linux / glibc only; elsewhere, or with
AVKIT_KEEP_FREED_MEMORY=0, nothing changes. Allocations beyond 32 MB still get their own mappings: glibc
cannot put them in a thread's heap, and disabling mmap would make them fail there.
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
