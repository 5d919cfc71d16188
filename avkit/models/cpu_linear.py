"""The CPU backend's bf16 matmul: pre-packed weights and one of three kernels: AVX2 + FMA (``cpu_linear.cpp``, the
default without AMX), AVX512-BF16's VDPBF16PS (``cpu_linear512.cpp``) or AMX tiles (``cpu_linear_amx.cpp``: 1-16 rows at about
the cost of reading the weight: the default where the CPU has AMX).

PyTorch computes a bf16 ``F.linear`` with more than one input row on x86 CPUs without AVX512-BF16
or AMX through a scalar fallback (4 rows cost 2.5x one row), and oneDNN refuses bf16 on such CPUs. A decoder reads every weight once per
forward, so decode and verification (B x (1 + k) rows) are bound by how fast the weights stream.
The kernel here packs each weight once into 16-row panels and streams them with fp32 accumulation.

It computes what ``F.linear`` computes for bf16 tensors (bf16 inputs and weights, fp32 sums, one
rounding to bf16 per output), differing only in the fp32 summation order (and, for the AMX and AVX512-BF16
kernels, denormal products flushed to zero). Each kernel computes a row the same way whatever
other rows share the call (batch invariance). It is used only for bf16 weights on a CPU that reports
AVX2 and only if the extension compiles (g++ and ninja, once per machine and kernel version, ~1 min,
cached by torch in ``~/.cache/torch_extensions``); otherwise, on CUDA and for float32, ``F.linear``
runs unchanged. ``AVKIT_CPU_KERNELS=0`` turns them all off; ``AVKIT_CPU_KERNEL`` picks one (``default_kind``).

Glossary
--------
kind        the kernel: ``"amx_bf16"``, ``"avx512_bf16"`` or ``"avx2"`` (``PackedLinear.kind``)
panel       16 consecutive output rows of W. avx2: k-major, ``packed[p, k, j] = W[16 p + ORDER[j], k]``;
            amx_bf16 / avx512_bf16: k in pairs, ``packed[p, k2, j, e] = W[16 p + j, 2 k2 + e]`` (K zero-padded to a
            multiple of 32 / 2)
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

from avkit.errors import ConfigError
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
_SOURCE512 = Path(__file__).with_name("cpu_linear512.cpp")
_SOURCE_AMX = Path(__file__).with_name("cpu_linear_amx.cpp")
_CFLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp")
_CFLAGS512 = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp")
_CFLAGS_AMX = ("-O3", "-mavx512f", "-mamx-tile", "-mamx-bf16", "-fopenmp")
KINDS = ("amx_bf16", "avx512_bf16", "avx2")  # fastest first
_PAIR_ALIGN = {"amx_bf16": 32, "avx512_bf16": 2}  # K padded to a multiple of this in the paired layout


def build_name(source: Path, cflags: tuple[str, ...]) -> str:
    """``avkit_<stem>_<hash of source, headers, flags and the source's path>``: one build directory per kernel
    version and checkout, so checkouts with different kernels (branches, an upgrade), or the same kernel at another
    path (torch's build file names the source by path, and a changed path rebuilds), never rebuild over each other
    in torch's shared cache."""
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))  # what the sources include
    where = str(source.resolve()).encode()
    digest = hashlib.sha256(source.read_bytes() + headers + " ".join(cflags).encode() + where).hexdigest()[:12]
    return f"avkit_{source.stem}_{digest}"


def runs_here(cflags: tuple[str, ...]) -> bool:
    """Whether a kernel compiled with ``cflags`` may run on this CPU: not with ``AVKIT_CPU_KERNELS=0``, nor on a CPU
    without AVX2 (or AVX512-BF16 for ``_CFLAGS512``, AMX tiles for ``_CFLAGS_AMX``)."""
    if os.environ.get("AVKIT_CPU_KERNELS", "1") == "0":
        return False
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    return not ((cflags == _CFLAGS512 and not torch.cpu._is_avx512_bf16_supported()) or
                (cflags == _CFLAGS_AMX and not torch.cpu._is_amx_tile_supported()))


@functools.cache
def load_extension(source: Path, cflags: tuple[str, ...] = _CFLAGS):
    """The CPU backend's compiled kernel module built from ``source`` (a .cpp beside this file), or None where it
    cannot run here (``runs_here``) or there is no compiler / ninja (warned). ``avkit/models/native.py`` builds
    them all ahead of use."""
    if not runs_here(cflags):
        return None
    try:
        from torch.utils.cpp_extension import _get_build_directory, load  # lazy: torch.utils.cpp_extension (builds on first use)

        name = build_name(source, cflags)
        clear_stale_build_lock(Path(_get_build_directory(name, verbose=False)))
        return load(name=name, sources=[str(source)], extra_cflags=list(cflags), extra_ldflags=["-fopenmp"],
                    verbose=False)
    except Exception as exc:  # no compiler / ninja: the plain torch path still computes the same thing
        warnings.warn(f"avkit: CPU kernel {source.name} unavailable ({type(exc).__name__}: {exc}); using torch",
                      stacklevel=2)
        return None


def _extension(kind: str):
    if kind == "amx_bf16":
        ext = load_extension(_SOURCE_AMX, _CFLAGS_AMX)
        return ext if ext is not None and ext.available() else None  # the OS must grant the tile state
    return load_extension(_SOURCE512, _CFLAGS512) if kind == "avx512_bf16" else load_extension(_SOURCE)


_KIND_FLAGS = {"amx_bf16": _CFLAGS_AMX, "avx512_bf16": _CFLAGS512, "avx2": _CFLAGS}


def candidate_kinds() -> list[str]:
    """The kernels this CPU may run, decided without building any (``kinds()`` builds them and keeps those that
    work)."""
    return [k for k in KINDS if runs_here(_KIND_FLAGS[k])]


@functools.cache
def kinds() -> list[str]:
    """The kernels that run here (each one built), e.g. ``["amx_bf16", "avx512_bf16", "avx2"]``, or []."""
    return [k for k in KINDS if _extension(k) is not None]


def default_kind() -> str:
    """The kernel new ``PackedLinear`` layers use: ``$AVKIT_CPU_KERNEL`` if set, else amx_bf16 where the CPU has
    AMX tiles (and the OS grants them), else avx2 (why, measured: docs/runtime.md). A model's forwards must all use
    one kernel (batch invariance), so the choice is per deployment, never per call."""
    kind = os.environ.get("AVKIT_CPU_KERNEL", "") or ("amx_bf16" if _extension("amx_bf16") is not None else "avx2")
    if kind not in KINDS or _extension(kind) is None:
        raise ConfigError(f"AVKIT_CPU_KERNEL={kind!r}: expected one of the kernels that run here, {kinds()}")
    return kind


def available() -> bool:
    return _extension("avx2") is not None


def pack(weight: torch.Tensor, kind: str | None = None) -> torch.Tensor:
    """``W [N, K]`` -> the panels of ``kind`` (default: ``default_kind()``); zeros pad N to 16 rows and,
    for avx512_bf16, K to even. avx2: ``[ceil(N / 16), K, 16]``; avx512_bf16: ``[ceil(N / 16), ceil(K / 2), 16, 2]``."""
    kind = kind or default_kind()
    n, k = weight.shape
    pad_n, pad_k = (-n) % PANEL, (-k) % _PAIR_ALIGN.get(kind, 1)
    weight = F.pad(weight, (0, pad_k, 0, pad_n)) if pad_n or pad_k else weight
    if kind in _PAIR_ALIGN:
        return weight.view(-1, PANEL, (k + pad_k) // 2, 2).transpose(1, 2).contiguous()  # [P, K/2, 16, 2]
    return weight.view(-1, PANEL, k)[:, _ORDER].transpose(1, 2).contiguous()  # [P, K, 16]


def unpack(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """``pack``'s inverse: ``W [n, k]``."""
    if packed.dim() == 4:  # amx_bf16, avx512_bf16
        return packed.transpose(1, 2).reshape(packed.shape[0] * PANEL, -1)[:n, :k]
    p, kk, _ = packed.shape
    return packed.transpose(1, 2)[:, _INVERSE].reshape(p * PANEL, kk)[:n]


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int,
           kind: str | None = None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` for bf16 ``x [..., K]`` from ``pack(W, kind)`` (``kind`` None: avx2's layout)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])  # [M, K]
    b = bias if bias is not None else x2.new_empty(0)
    kind = kind or "avx2"
    if packed.dim() != (4 if kind in _PAIR_ALIGN else 3):
        raise ConfigError(f"cpu_linear.linear: a {packed.dim()}-dim packed weight is not {kind}'s layout")
    if kind in _PAIR_ALIGN:  # x as bf16 pairs, K zero-padded like the weight (the model's x is bf16 already)
        pad = 2 * packed.shape[1] - x2.shape[1]
        x2 = (F.pad(x2, (0, pad)) if pad else x2).to(torch.bfloat16).contiguous()
    y = _extension(kind).linear_bf16(x2, packed, b, out_features)  # [M, N]
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
        self.kind = default_kind()  # the kernel this layer's panels are laid out for
        self.register_buffer("packed", pack(weight, self.kind))
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def unpacked(self) -> torch.Tensor:
        return unpack(self.packed, self.out_features, self.in_features)

    def forward(self, x: torch.Tensor, bulk: bool = False) -> torch.Tensor:
        """``bulk``: prefill rows, computed by oneDNN where this layer keeps its copy (else the kernel)."""
        if x.device.type != "cpu" or not available():
            return F.linear(x, self.unpacked(), self.bias)
        if bulk and self.bulk_weight is not None:
            return cpu_bulk.linear(x, self.bulk_weight, self.bias)
        return linear(x, self.packed, self.bias, self.out_features, self.kind)
