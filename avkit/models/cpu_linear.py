"""The CPU backend's bf16 matmul: pre-packed weights and an AVX2 + FMA kernel (``cpu_linear.cpp``).

PyTorch computes a bf16 ``F.linear`` with more than one input row on x86 CPUs without AVX512-BF16
or AMX through a scalar fallback (measured on this project's 2-core AVX2 box: 4 rows cost 2.5x one
row, 16 rows 12x), and oneDNN refuses bf16 on such CPUs. A decoder reads every weight once per
forward, so decode and verification (B x (1 + k) rows) are bound by how fast the weights stream.
The kernel here packs each weight once into 16-row panels and streams them with fp32 accumulation.

It computes what ``F.linear`` computes for bf16 tensors (bf16 inputs and weights, fp32 sums, one
rounding to bf16 per output), differing only in the fp32 summation order. It is used only for bf16
weights on a CPU that reports AVX2 and only if the extension compiles (g++ and ninja, once per
machine and kernel version, ~1 min, cached by torch in ``~/.cache/torch_extensions``); otherwise, on CUDA and for
float32, ``F.linear`` runs unchanged. ``AVKIT_CPU_KERNELS=0`` turns it off.

Glossary
--------
panel       16 consecutive output rows of W stored k-major: ``packed[p, k, j] = W[16 p + ORDER[j], k]``
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from avkit.models import cpu_bulk

PANEL = 16  # output rows per panel (NR in the kernel)
# Within a panel, k's 16 values are stored as rows (0-3, 8-11, 4-7, 12-15): the kernel widens bf16 to fp32 with
# AVX2 unpacklo/unpackhi, which interleave 128-bit lanes and so return rows 0-7 and 8-15 in order.
_ORDER = torch.tensor([0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15])
_INVERSE = torch.argsort(_ORDER)


STALE_BUILD_LOCK_S = 1800  # a build takes ~1 min on 2 idle cores; a lock this old was left by a killed build


def clear_stale_build_lock(build_dir: Path, max_age_s: float = STALE_BUILD_LOCK_S) -> bool:
    """Remove ``build_dir/lock`` when older than ``max_age_s``; True if removed.

    torch's extension builder holds that file while it compiles and waits, without a timeout, for any
    other holder to delete it; a build killed mid-way leaves it behind, and every later import would hang.
    """
    lock = build_dir / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < max_age_s:
        return False
    lock.unlink(missing_ok=True)
    warnings.warn(f"avkit: removed a stale build lock {lock} ({age / 60:.0f} min old)", stacklevel=2)
    return True


_SOURCE = Path(__file__).with_suffix(".cpp")
_CFLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp")


def _build_name(source: Path) -> str:
    """``avkit_<stem>_<hash of source, headers and flags>``: one build directory per kernel version, so checkouts
    with different kernels (branches, an upgrade) never rebuild over each other in torch's shared cache."""
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))  # what the sources include
    digest = hashlib.sha256(source.read_bytes() + headers + " ".join(_CFLAGS).encode()).hexdigest()[:12]
    return f"avkit_{source.stem}_{digest}"


@functools.cache
def load_extension(source: Path):
    """The CPU backend's compiled kernel module built from ``source`` (a .cpp beside this file), or None where it
    cannot run here: ``AVKIT_CPU_KERNELS=0``, a CPU without AVX2, or no compiler / ninja (warned)."""
    if os.environ.get("AVKIT_CPU_KERNELS", "1") == "0":
        return None
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return None
    try:
        from torch.utils.cpp_extension import _get_build_directory, load

        name = _build_name(source)
        clear_stale_build_lock(Path(_get_build_directory(name, verbose=False)))
        return load(name=name, sources=[str(source)], extra_cflags=list(_CFLAGS), extra_ldflags=["-fopenmp"],
                    verbose=False)
    except Exception as exc:  # no compiler / ninja: the plain torch path still computes the same thing
        warnings.warn(f"avkit: CPU kernel {source.name} unavailable ({type(exc).__name__}: {exc}); using torch",
                      stacklevel=2)
        return None


def _extension():
    return load_extension(_SOURCE)


def available() -> bool:
    return _extension() is not None


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``W [N, K]`` -> panels ``[ceil(N / 16), K, 16]`` (zero rows pad the last panel)."""
    n, k = weight.shape
    pad = (-n) % PANEL
    if pad:
        weight = torch.cat([weight, weight.new_zeros(pad, k)])
    return weight.view(-1, PANEL, k)[:, _ORDER].transpose(1, 2).contiguous()  # [P, K, 16]


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """``F.linear(x, W, bias)`` for bf16 ``x [..., K]`` from ``pack(W)``."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])  # [M, K]
    b = bias if bias is not None else x2.new_empty(0)
    y = _extension().linear_bf16(x2, packed, b, out_features)  # [M, N]
    return y.view(*lead, out_features)


class PackedLinear(torch.nn.Module):
    """A frozen ``nn.Linear`` (or tied embedding) whose bf16 weight lives pre-packed for the CPU kernel.

    ``weight`` stays available (same storage as before packing is not kept: the panels replace it), so
    ``unpacked()`` rebuilds it for code that needs ``[N, K]`` (tests, moving the model to another device).
    ``bulk=True`` (prefill rows only) also keeps oneDNN's copy and runs ``forward(x, bulk=True)`` there
    (cpu_bulk.py); the copy is a plain attribute, outside ``state_dict``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bulk: bool = False):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bulk_weight = cpu_bulk.pack(weight) if bulk else None  # oneDNN-blocked [N, K], or None
        self.register_buffer("packed", pack(weight))
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def unpacked(self) -> torch.Tensor:
        p, k, _ = self.packed.shape
        return self.packed.transpose(1, 2)[:, _INVERSE].reshape(p * PANEL, k)[: self.out_features]

    def forward(self, x: torch.Tensor, bulk: bool = False) -> torch.Tensor:
        """``bulk``: prefill rows, computed by oneDNN where this layer keeps its copy (else the kernel)."""
        if x.device.type != "cpu" or not available():
            return F.linear(x, self.unpacked(), self.bias)
        if bulk and self.bulk_weight is not None:
            return cpu_bulk.linear(x, self.bulk_weight, self.bias)
        return linear(x, self.packed, self.bias, self.out_features)
