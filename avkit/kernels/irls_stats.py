"""IRLS statistics, Triton: per-block partial sums, reduced in a fixed order (deterministic).

Each program reads BLOCK rows once, builds the one-hot [BLOCK, K_PAD] of their positions and
reduces the five weighted columns and the count over its rows; the host-side sum over blocks
is in float64 and in block order, so repeated runs agree bit for bit (no atomics).
Spec and CPU path: `avkit.kernels.irls_stats_ref.irls_stats_ref` (float32 inside a block, so
the two agree to ~1e-6 relative).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from avkit.kernels.irls_stats_ref import IrlsStats, irls_inputs


@triton.jit
def irls_stats_kernel(
    f_ptr, pos_ptr, p_ptr, y_ptr, obs_ptr,  # *[N]: fp32 feature, int64 position, fp32 prediction,
                                            #   fp32 label, bool observed
    partial_ptr,  # *[num_blocks, 6, K_PAD] fp32: a, b, c, g0, g1, n
    N, K,
    K_PAD: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    inb = offs < N
    pos = tl.load(pos_ptr + offs, mask=inb, other=-1)
    keep = tl.load(obs_ptr + offs, mask=inb, other=0).to(tl.int1) & (pos >= 0) & (pos < K)
    f = tl.load(f_ptr + offs, mask=keep, other=0.0)
    p = tl.load(p_ptr + offs, mask=keep, other=0.0)
    y = tl.load(y_ptr + offs, mask=keep, other=0.0)
    w = p * (1.0 - p)
    r = y - p
    kk = tl.arange(0, K_PAD)
    hot = (pos[:, None] == kk[None, :]) & keep[:, None]  # [BLOCK, K_PAD]
    out = partial_ptr + pid * 6 * K_PAD + kk
    tl.store(out + 0 * K_PAD, tl.sum(tl.where(hot, (w * f * f)[:, None], 0.0), 0))
    tl.store(out + 1 * K_PAD, tl.sum(tl.where(hot, (w * f)[:, None], 0.0), 0))
    tl.store(out + 2 * K_PAD, tl.sum(tl.where(hot, w[:, None], 0.0), 0))
    tl.store(out + 3 * K_PAD, tl.sum(tl.where(hot, (r * f)[:, None], 0.0), 0))
    tl.store(out + 4 * K_PAD, tl.sum(tl.where(hot, r[:, None], 0.0), 0))
    tl.store(out + 5 * K_PAD, tl.sum(hot.to(tl.float32), 0))  # <= BLOCK: exact in fp32


def irls_stats_triton(features, positions, predictions, labels, observed, num_positions: int,
                      *, check: bool = True, block: int = 1024) -> IrlsStats:
    """Same contract as `irls_stats_ref`."""
    f, pos, p, y, obs = irls_inputs(features, positions, predictions, labels, observed, num_positions, check)
    N, K = f.numel(), num_positions
    k_pad = triton.next_power_of_2(K)
    blocks = max(triton.cdiv(N, block), 1)
    partial = torch.zeros(blocks, 6, k_pad, dtype=torch.float32, device=f.device)
    if N:
        irls_stats_kernel[(blocks,)](f.contiguous(), pos.contiguous(), p.contiguous(), y.contiguous(),
                                     obs.contiguous(), partial, N, K, K_PAD=k_pad, BLOCK=block)
    sums = partial.double().sum(0)[:, :K]  # [6, K], block order
    return IrlsStats(*sums[:5], n=sums[5].round().to(torch.int64))
