"""The CPU backend's bf16 matmul (docs/runtime.md "linears and the LM head"): pre-packed weights and one of three
kernels, AVX2 + FMA (``cpu_linear.cpp``, the default without AMX), AVX512-BF16 (``cpu_linear512.cpp``) or AMX
tiles (``cpu_linear_amx.cpp``); ``F.linear``'s result up to summation order, each row computed the same way
whatever rows share the call (batch invariance). ``AVKIT_CPU_KERNEL`` picks one (``default_kind``).

Panel: 16 consecutive output rows of W. avx2: k-major, ``packed[p, k, j] = W[16 p + ORDER[j], k]``; amx_bf16 /
avx512_bf16: k in pairs, ``packed[p, k2, j, e] = W[16 p + j, 2 k2 + e]`` (K zero-padded to a multiple of 32 / 2).
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from avkit.errors import ConfigError
from avkit.models import cpu_bulk, native

PANEL = 16  # output rows per panel (NR in the kernel)
# Within a panel, k's 16 values are stored as rows (0-3, 8-11, 4-7, 12-15): the kernel widens bf16 to fp32 with
# AVX2 unpacklo/unpackhi, which interleave 128-bit lanes and so return rows 0-7 and 8-15 in order.
_ORDER = torch.tensor([0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15])
_INVERSE = torch.argsort(_ORDER)
_PAIR_ALIGN = {"amx_bf16": 32, "avx512_bf16": 2}  # K padded to a multiple of this in the paired layout
KINDS = ("amx_bf16", "avx512_bf16", "avx2")  # fastest first


def _extension(kind: str):
    ext = native.load(kind)
    if kind == "amx_bf16" and ext is not None and not ext.available():  # the OS must grant the tile state
        return None
    return ext


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
    return native.load("avx2") is not None


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
           kind: str = "avx2") -> torch.Tensor:
    """``F.linear(x, W, bias)`` for bf16 ``x [..., K]`` from ``pack(W, kind)``."""
    assert packed.dim() == (4 if kind in _PAIR_ALIGN else 3), f"not {kind}'s layout: {tuple(packed.shape)}"
    x2 = x.reshape(-1, x.shape[-1])  # [M, K]
    if kind in _PAIR_ALIGN:  # x as bf16 pairs, K zero-padded like the weight (the model's x is bf16 already)
        pad = 2 * packed.shape[1] - x2.shape[1]
        x2 = (F.pad(x2, (0, pad)) if pad else x2).to(torch.bfloat16).contiguous()
    y = _extension(kind).linear_bf16(x2, packed, bias if bias is not None else x2.new_empty(0), out_features)
    return y.view(*x.shape[:-1], out_features)  # [..., N]


class PackedLinear(torch.nn.Module):
    """A frozen ``nn.Linear`` (or tied embedding) whose bf16 weight lives pre-packed (the panels replace it;
    ``unpacked()`` rebuilds ``[N, K]``). ``bulk=True`` also keeps oneDNN's copy for ``forward(x, bulk=True)``
    (prefill rows, cpu_bulk.py), a plain attribute outside ``state_dict``."""

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
        if x.device.type != "cpu" or not available():
            return F.linear(x, self.unpacked(), self.bias)
        if bulk and self.bulk_weight is not None:
            return cpu_bulk.linear(x, self.bulk_weight, self.bias)
        return linear(x, self.packed, self.bias, self.out_features, self.kind)
