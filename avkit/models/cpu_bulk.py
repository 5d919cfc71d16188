"""The CPU backend's prefill matmuls (docs/runtime.md "prefill linears"): oneDNN's AMX / AVX512-BF16 bf16 path,
every call exactly ``BULK_ROWS`` rows (zero-padded; oneDNN blocks by the row count), so a token's prefill result
never depends on the other tokens of its forward. ``AVKIT_CPU_BULK=0`` turns it off.
"""

from __future__ import annotations

import functools
import os

import torch

BULK_ROWS = 128  # rows per oneDNN call: ~2,000 GFLOP/s on the target's shapes on 2 AMX cores (64 rows: ~1,360)


@functools.cache
def available() -> bool:
    """oneDNN has a bf16 fast path on this CPU and the bulk path is not turned off."""
    if os.environ.get("AVKIT_CPU_BULK", "1") == "0" or not torch.backends.mkldnn.is_available():
        return False
    return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())


def pack(weight: torch.Tensor) -> torch.Tensor:
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


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` for bf16 ``x [..., K]`` from ``pack(W)``, ``BULK_ROWS`` rows per call."""
    x2, m = _blocks(x)
    y = torch.cat([torch.ops.mkldnn._linear_pointwise(x2[r:r + BULK_ROWS], packed, bias, "none", [], "")
                   for r in range(0, x2.shape[0], BULK_ROWS)])  # [M + pad, N]
    return y[:m].view(*x.shape[:-1], y.shape[-1])


def gated_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """``down(silu(gate) * up)`` with ``gate, up = gate_up(x).chunk(2)``, bf16 ``x [..., K]``, from ``pack``ed
    weights, ``BULK_ROWS`` rows at a time: a block's [rows, 2 I] product stays in the core's cache and no
    [M, 2 I] tensor is allocated (a quarter of a 3,000-token prefill of the 1.5B target); same per-row maths."""
    x2, m = _blocks(x)
    h = x2.new_empty(x2.shape[0], gate_up.size(0) // 2)  # [M + pad, I] silu(gate) * up
    for r in range(0, x2.shape[0], BULK_ROWS):
        gate, up = torch.ops.mkldnn._linear_pointwise(x2[r:r + BULK_ROWS], gate_up, None, "none", [], "").chunk(2, -1)
        torch.mul(torch.nn.functional.silu(gate), up, out=h[r:r + BULK_ROWS])
    return linear(h, down, None)[:m].view(*x.shape[:-1], -1)
