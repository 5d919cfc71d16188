"""The CPU backend's native code built ahead of use, in a child process that a signal can stop.

The kernels (``cpu_linear*.cpp``, ``cpu_attention.cpp``, ``cpu_sampling.cpp``) are compiled by torch's
extension builder the first time they are loaded, into ``~/.cache/torch_extensions`` (about a minute on
2 cores). ``avkit serve`` builds them before it opens its port, so the first request does not pay for it.

The build runs in a child process of its own session: a SIGTERM or Ctrl-C to the parent (surfacing as
``KeyboardInterrupt``) kills the child's whole process group (the compiler included) at once and removes
the build locks the child created, which torch's builder would otherwise wait on forever.

    python -m avkit.models.native [SOURCE...]   # build these kernels (default: all that run here), in this process
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from avkit.models import cpu_attention, cpu_linear, cpu_sampling

# (source, cflags, bf16 only) of every kernel; which of them run on this CPU is `cpu_linear.runs_here`'s rule.
# The linears and the attention serve bf16 models only; the sampler's passes serve float32 logits too.
KERNELS = (
    (cpu_linear._SOURCE, cpu_linear._CFLAGS, True),
    (cpu_linear._SOURCE512, cpu_linear._CFLAGS512, True),
    (cpu_linear._SOURCE_AMX, cpu_linear._CFLAGS_AMX, True),
    (cpu_attention._SOURCE, cpu_linear._CFLAGS, True),
    (cpu_sampling._SOURCE, cpu_linear._CFLAGS, False),
)


def build_dir(source: Path, cflags: tuple[str, ...]) -> Path:
    """Where torch's builder puts this kernel (``$TORCH_EXTENSIONS_DIR`` or its default root)."""
    from torch.utils.cpp_extension import _get_build_directory  # lazy: setuptools and the build tools behind it

    return Path(_get_build_directory(cpu_linear.build_name(source, cflags), verbose=False))


def missing(bf16: bool = True) -> list[str]:
    """The kernels a model of this dtype (``bf16``, else float32) uses on this CPU that have no built module
    yet (source file names)."""
    return [source.name for source, cflags, bf16_only in KERNELS if (bf16 or not bf16_only)
            and cpu_linear.runs_here(cflags)
            and not (build_dir(source, cflags) / f"{cpu_linear.build_name(source, cflags)}.so").is_file()]


def build(names: list[str]) -> None:
    """Build (or load from torch's cache) the kernels of these source names, in this process."""
    for source, cflags, _ in KERNELS:
        if source.name in names:
            cpu_linear.load_extension(source, cflags)


def build_in_child(bf16: bool = True, log=None) -> float:
    """Build the kernels ``missing(bf16)`` names in a child process; seconds spent (0.0 when none was missing).

    ``log(message)`` is told what is built before it starts. Any exception in the parent while waiting
    (``KeyboardInterrupt`` from SIGINT or SIGTERM) kills the child's process group, removes the locks it
    left and is re-raised.
    """
    todo = missing(bf16)
    if not todo:
        return 0.0
    if log is not None:
        log(f"building the CPU kernels {', '.join(todo)} (once per machine and kernel version)")
    t0 = time.time()
    child = subprocess.Popen([sys.executable, "-m", "avkit.models.native", *todo], start_new_session=True)
    try:
        code = child.wait()
    except BaseException:
        _stop_group(child)
        _remove_locks(since=t0)
        raise
    if code != 0 and log is not None:  # each kernel falls back to torch where it cannot build
        log(f"building the CPU kernels exited with code {code}; the torch path runs where one is missing")
    return time.time() - t0


def _stop_group(child: subprocess.Popen, wait_s: float = 2.0) -> None:
    """SIGTERM the child's process group (ninja passes it on to the compilers, which it runs in process groups
    of their own), wait up to ``wait_s`` for the group to empty, then SIGKILL what is left."""
    os.killpg(child.pid, signal.SIGTERM)
    child.wait()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(child.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _remove_locks(since: float) -> None:
    """Remove the builder's ``lock`` files created after ``since`` (by the killed child)."""
    for source, cflags, _ in KERNELS:
        lock = build_dir(source, cflags) / "lock"
        try:
            if lock.stat().st_mtime >= since - 1.0:
                lock.unlink()
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    build(sys.argv[1:] or [source.name for source, _, _ in KERNELS])
