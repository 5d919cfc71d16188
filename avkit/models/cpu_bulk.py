"""The CPU backend's prefill matmuls: oneDNN's AMX / AVX512-BF16 path in fixed-size calls.

Prefill is compute-bound: avkit's AVX2 kernel reaches ~75 GFLOP/s on 2 cores, oneDNN's bf16 matmul with a
pre-packed weight ~2,000 on 2 AMX cores at 128 rows per call (~1,360 at 64). oneDNN picks its blocking by
the number of rows, so every call here has exactly ``BULK_ROWS`` rows (the last chunk zero-padded): a token's
prefill result never depends on the other tokens of its forward. Decode and verify rows stay on cpu_linear's
kernel, so greedy speculative output still equals greedy target-only output. Only where oneDNN has a bf16 fast
path; ``AVKIT_CPU_BULK=0`` turns it off. It keeps a second copy of each packed weight (1.5B target: +2.6 GB).
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
    weights, ``BULK_ROWS`` rows at a time: a block's [rows, 2 I] gate/up product and its elementwise work stay
    in the core's cache, and no [M, 2 I] tensor is ever allocated, paged in and concatenated (for a
    3,000-token prefill of the 1.5B target that was a quarter of the time). The same per-row maths as the
    three separate calls: each row's result does not depend on its companions."""
    x2, m = _blocks(x)
    h = x2.new_empty(x2.shape[0], gate_up.size(0) // 2)  # [M + pad, I] silu(gate) * up
    for r in range(0, x2.shape[0], BULK_ROWS):
        gate, up = torch.ops.mkldnn._linear_pointwise(x2[r:r + BULK_ROWS], gate_up, None, "none", [], "").chunk(2, -1)
        torch.mul(torch.nn.functional.silu(gate), up, out=h[r:r + BULK_ROWS])
    return linear(h, down, None)[:m].view(*x.shape[:-1], -1)
