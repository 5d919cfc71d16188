"""The CPU backend's C++ kernels (beside this file), each built on first use by torch's extension builder into
``~/.cache/torch_extensions`` (about a minute on 2 cores; ``avkit serve`` builds them first, in a child process:
``build_in_child``). Where one cannot run (``AVKIT_CPU_KERNELS=0``, missing instructions) or build (warned),
``load`` returns None and the torch code it replaces, which stays the definition, runs (docs/runtime.md "Batch
invariance"). The linears' kernels serve cpu_linear.py; ``attention``, ``sampled_probs`` and ``row_stats`` below.

    python -m avkit.models.native [NAME...]   # build these kernels (default: all that run here), in this process
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

_HERE = Path(__file__).parent
_AVX2 = ("-O3", "-mavx2", "-mfma", "-fopenmp")
# name -> (source, cflags, whether only bf16 models use it); fastest linear first
KERNELS = {
    "amx_bf16": ("cpu_linear_amx.cpp", ("-O3", "-mavx512f", "-mamx-tile", "-mamx-bf16", "-fopenmp"), True),
    "avx512_bf16": ("cpu_linear512.cpp",
                    ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp"), True),
    "avx2": ("cpu_linear.cpp", _AVX2, True),
    "attention": ("cpu_attention.cpp", _AVX2, True),
    "sampling": ("cpu_sampling.cpp", _AVX2, False),
}
MAX_GROUP = 16  # query heads per kv head the attention kernel takes (GMAX in cpu_attention.cpp)
STALE_BUILD_LOCK_S = 1800  # a build takes ~1 min on 2 idle cores; a lock this old was left by a killed build


def runs_here(name: str) -> bool:
    """Not with ``AVKIT_CPU_KERNELS=0``, nor without AVX2 (AVX512-BF16 for avx512_bf16, AMX for amx_bf16)."""
    if os.environ.get("AVKIT_CPU_KERNELS", "1") == "0":
        return False
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    return not ((name == "avx512_bf16" and not torch.cpu._is_avx512_bf16_supported()) or
                (name == "amx_bf16" and not torch.cpu._is_amx_tile_supported()))


def build_name(name: str) -> str:
    """``avkit_<stem>_<hash of source, headers, flags, source path>``: two checkouts never rebuild over each other."""
    source, cflags = _HERE / KERNELS[name][0], KERNELS[name][1]
    headers = b"".join(h.read_bytes() for h in sorted(_HERE.glob("*.h")))  # what the sources include
    where = str(source.resolve()).encode()
    digest = hashlib.sha256(source.read_bytes() + headers + " ".join(cflags).encode() + where).hexdigest()[:12]
    return f"avkit_{source.stem}_{digest}"


def build_dir(name: str) -> Path:
    from torch.utils.cpp_extension import _get_build_directory  # lazy: setuptools and the build tools behind it

    return Path(_get_build_directory(build_name(name), verbose=False))


def clear_stale_build_lock(directory: Path, max_age_s: float = STALE_BUILD_LOCK_S) -> bool:
    """Remove ``directory/lock`` older than ``max_age_s`` (True if removed): torch's builder waits for it forever,
    and a killed build leaves it behind."""
    lock = directory / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < max_age_s:
        return False
    lock.unlink(missing_ok=True)
    warnings.warn(f"avkit: removed a stale build lock {lock} ({age / 60:.0f} min old)", stacklevel=2)
    return True


@functools.cache
def load(name: str):
    """The compiled module of kernel ``name`` (a key of ``KERNELS``), or None where it cannot run or build here."""
    if not runs_here(name):
        return None
    source, cflags, _ = KERNELS[name]
    try:
        from torch.utils.cpp_extension import load as build  # lazy: torch.utils.cpp_extension (builds on first use)

        clear_stale_build_lock(build_dir(name))
        return build(name=build_name(name), sources=[str(_HERE / source)], extra_cflags=list(cflags),
                     extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as exc:  # no compiler / ninja: the plain torch path still computes the same thing
        warnings.warn(f"avkit: CPU kernel {source} unavailable ({type(exc).__name__}: {exc}); using torch",
                      stacklevel=2)
        return None


def missing(bf16: bool = True) -> list[str]:
    """The kernels a model of this dtype (``bf16``, else float32) uses on this CPU that have no built module yet."""
    return [name for name, (_, _, bf16_only) in KERNELS.items() if (bf16 or not bf16_only) and runs_here(name)
            and not (build_dir(name) / f"{build_name(name)}.so").is_file()]


def build_in_child(bf16: bool = True, log=None) -> float:
    """Build ``missing(bf16)`` in a child process; seconds spent. An exception while waiting (SIGINT, SIGTERM) kills
    the child's process group, compilers included, removes the locks it left, and is re-raised."""
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
        for name in KERNELS:  # the builder's locks created since t0, by the killed child
            lock = build_dir(name) / "lock"
            with contextlib.suppress(FileNotFoundError):
                if lock.stat().st_mtime >= t0 - 1.0:
                    lock.unlink()
        raise
    if code != 0 and log is not None:  # each kernel falls back to torch where it cannot build
        log(f"building the CPU kernels exited with code {code}; the torch path runs where one is missing")
    return time.time() - t0


def _stop_group(child: subprocess.Popen, wait_s: float = 2.0) -> None:
    """SIGTERM the child's group (ninja passes it on to its compilers' own groups), SIGKILL it after ``wait_s``."""
    os.killpg(child.pid, signal.SIGTERM)
    child.wait()
    deadline = time.monotonic() + wait_s
    with contextlib.suppress(ProcessLookupError):  # the group is gone
        while time.monotonic() < deadline:
            os.killpg(child.pid, 0)
            time.sleep(0.02)
        os.killpg(child.pid, signal.SIGKILL)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, ends: torch.Tensor,
              scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v per query row over keys [0, ends[b, s]) of cache slot ``slots[b]`` (ends 0: a pad),
    in an order fixed by the span alone: a token's output is bit-identical however it is batched.

    q [B, S, H, D] bf16; k, v: one layer of the cache [max_batch, H_kv, T, D] bf16, contiguous (GQA: query head
    h reads kv head h // (H / H_kv)); slots [B] int64; ends [B, S] int64 in [0, T] -> [B, S, H, D] bf16.
    """
    return load("attention").attention_bf16(q, k, v, slots, ends, scale)


def sampling_usable(logits: torch.Tensor) -> bool:
    """Whether these [N, V] logits (CPU, float32 or bf16) can take the native sampling passes here."""
    return logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.bfloat16) \
        and load("sampling") is not None


def sampled_probs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """runtime/sampling.py ``_sampled_probs`` without top-k / min-p: logits [N, V] float32 or bf16, temperature [N]
    (> 0), top_p [N] -> [N, V] float32 probabilities."""
    return load("sampling").sampled_probs(logits.contiguous(), temperature.float().contiguous(),
                                          top_p.float().contiguous())


def row_stats(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """The reductions features.py ``draft_features`` starts from. logits [N, V] float32 or bf16, temperature [N]
    (> 0) -> [N, 4] float32 (m, m2, s_o, sum_others e (x/T - m))
    of x / T: its largest and second-largest values, and over the others (all but one argmax) the sums of
    e = exp(x / T - m) and of e (x / T - m)."""
    return load("sampling").row_stats(logits.contiguous(), temperature.float().contiguous())


if __name__ == "__main__":
    for kernel in sys.argv[1:] or list(KERNELS):
        load(kernel)
