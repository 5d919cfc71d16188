"""The CPU backend's bf16 matmul (docs/runtime.md "linears and the LM head"): pre-packed weights and one of three
kernels, AVX2 + FMA (``cpu_linear.cpp``, the default without AMX), AVX512-BF16 (``cpu_linear512.cpp``) or AMX
tiles (``cpu_linear_amx.cpp``); ``F.linear``'s result up to summation order, each row computed the same way
whatever rows share the call (batch invariance). ``AVKIT_CPU_KERNEL`` picks one (``default_kind``). Prefill rows
(docs/runtime.md "prefill linears") take oneDNN's AMX / AVX512-BF16 path instead, every call exactly ``BULK_ROWS``
rows (zero-padded; oneDNN blocks by the row count), so a token's result never depends on the other tokens of its
forward; ``AVKIT_CPU_BULK=0`` turns it off.

Panel: 16 consecutive output rows of W. avx2: k-major, ``packed[p, k, j] = W[16 p + ORDER[j], k]``; amx_bf16 /
avx512_bf16: k in pairs, ``packed[p, k2, j, e] = W[16 p + j, 2 k2 + e]`` (K zero-padded to a multiple of 32 / 2).
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from avkit.errors import ConfigError
from avkit.models import native

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


BULK_ROWS = 128  # rows per oneDNN call: ~2,000 GFLOP/s on the target's shapes on 2 AMX cores (64 rows: ~1,360)


@functools.cache
def bulk_available() -> bool:
    """oneDNN has a bf16 fast path on this CPU and the bulk path is not turned off."""
    if os.environ.get("AVKIT_CPU_BULK", "1") == "0" or not torch.backends.mkldnn.is_available():
        return False
    return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())


def bulk_pack(weight: torch.Tensor) -> torch.Tensor:
    """``W [N, K]`` bf16 -> oneDNN's blocked layout for ``BULK_ROWS``-row calls (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), BULK_ROWS)


def _blocks(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x [..., K]`` -> (bf16 ``[M + pad, K]`` contiguous, zero-padded to whole ``BULK_ROWS`` blocks; ``M``)."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k).to(torch.bfloat16)  # [M, K]
    m = x2.shape[0]
    pad = (-m) % BULK_ROWS
    if pad:
        x2 = torch.cat([x2, x2.new_zeros(pad, k)])  # [M + pad, K]
    return x2.contiguous(), m


def bulk_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` for bf16 ``x [..., K]`` from ``bulk_pack(W)``, ``BULK_ROWS`` rows per call."""
    x2, m = _blocks(x)
    y = torch.cat([torch.ops.mkldnn._linear_pointwise(x2[r:r + BULK_ROWS], packed, bias, "none", [], "")
                   for r in range(0, x2.shape[0], BULK_ROWS)])  # [M + pad, N]
    return y[:m].view(*x.shape[:-1], y.shape[-1])


def gated_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """``down(silu(gate) * up)`` with ``gate, up = gate_up(x).chunk(2)``, bf16 ``x [..., K]``, from ``bulk_pack``ed
    weights, ``BULK_ROWS`` rows at a time: a block's [rows, 2 I] product stays in the core's cache and no
    [M, 2 I] tensor is allocated (a quarter of a 3,000-token prefill of the 1.5B target); same per-row maths."""
    x2, m = _blocks(x)
    h = x2.new_empty(x2.shape[0], gate_up.size(0) // 2)  # [M + pad, I] silu(gate) * up
    for r in range(0, x2.shape[0], BULK_ROWS):
        gate, up = torch.ops.mkldnn._linear_pointwise(x2[r:r + BULK_ROWS], gate_up, None, "none", [], "").chunk(2, -1)
        torch.mul(F.silu(gate), up, out=h[r:r + BULK_ROWS])
    return bulk_linear(h, down, None)[:m].view(*x.shape[:-1], -1)


class PackedLinear(torch.nn.Module):
    """A frozen ``nn.Linear`` (or tied embedding) whose bf16 weight lives pre-packed (the panels replace it;
    ``unpacked()`` rebuilds ``[N, K]``). ``bulk=True`` also keeps oneDNN's copy for ``forward(x, bulk=True)``
    (prefill rows, ``bulk_linear``), a plain attribute outside ``state_dict``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bulk: bool = False):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bulk_weight = bulk_pack(weight) if bulk else None  # oneDNN-blocked [N, K], or None
        self.kind = default_kind()  # the kernel this layer's panels are laid out for
        self.register_buffer("packed", pack(weight, self.kind))
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def unpacked(self) -> torch.Tensor:
        return unpack(self.packed, self.out_features, self.in_features)

    def forward(self, x: torch.Tensor, bulk: bool = False) -> torch.Tensor:
        if x.device.type != "cpu" or not available():
            return F.linear(x, self.unpacked(), self.bias)
        if bulk and self.bulk_weight is not None:
            return bulk_linear(x, self.bulk_weight, self.bias)
        return linear(x, self.packed, self.bias, self.out_features, self.kind)
