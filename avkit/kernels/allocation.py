"""Survival and budgeted allocation, Triton: two small launches, no sort.

1. `survival_kernel`: BLOCK_R requests per program, the product over positions taken left to
   right in float32, exactly as `avkit.scheduling.plan.survival` does (so survivals are bit-identical).
2. `allocation_kernel`: one program per request r computes the rank of each of its slots in the
   order (survival desc, request asc, position asc) by counting the valid slots that precede it,
   streaming all B*K survivals in blocks ([K_PAD, BLOCK_S] comparisons); slot (r, j) is verified
   iff its rank < budget. O((B*K)^2) comparisons: 3.2M at B=256, K=7, a few microseconds.
The budget is read from device memory, so it may come from a device-side argmax without a sync.
Spec and CPU path: `avkit.kernels.allocation_ref.allocate_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from avkit.kernels.allocation_ref import Allocation, allocation_inputs


@triton.jit
def survival_kernel(
    c_ptr,  # *[B, K] fp32 confidences (contiguous)
    nd_ptr,  # *[B] int64 drafts per request
    s_ptr,  # *[B, K] fp32 survival out (0 beyond num_drafted)
    B, K,
    K_PAD: tl.constexpr, BLOCK_R: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = rows < B
    nd = tl.load(nd_ptr + rows, mask=live, other=0)
    s = tl.full([BLOCK_R], 1.0, tl.float32)
    for j in tl.static_range(K_PAD):  # sequential product: s_j = s_{j-1} * c_j
        if j < K:
            s = s * tl.load(c_ptr + rows * K + j, mask=live, other=0.0)
            tl.store(s_ptr + rows * K + j, tl.where(j < nd, s, 0.0), mask=live)


@triton.jit
def allocation_kernel(
    s_ptr,  # *[B, K] fp32 survival
    nd_ptr,  # *[B] int64 drafts per request
    budget_ptr,  # *[1] int64 slots to verify
    nv_ptr,  # *[B] int64 out: verified prefix length
    B, K,
    K_PAD: tl.constexpr, BLOCK_S: tl.constexpr,
):
    r = tl.program_id(0)
    j = tl.arange(0, K_PAD)
    mine = r * K + j  # flat index: the tie order (request, position)
    valid = j < tl.load(nd_ptr + r)
    s = tl.load(s_ptr + mine, mask=valid, other=-1.0)  # [K_PAD]
    rank = tl.zeros([K_PAD], tl.int32)
    for start in range(0, B * K, BLOCK_S):
        i = start + tl.arange(0, BLOCK_S)  # [BLOCK_S] flat slots
        nd_i = tl.load(nd_ptr + i // K, mask=i < B * K, other=0)
        s_i = tl.load(s_ptr + i, mask=(i % K) < nd_i, other=-1.0)  # invalid -> -1, never precedes
        ahead = (s_i[None, :] > s[:, None]) | ((s_i[None, :] == s[:, None]) & (i[None, :] < mine[:, None]))
        rank += tl.sum((ahead & (s_i[None, :] >= 0.0)).to(tl.int32), 1)
    chosen = valid & (rank < tl.load(budget_ptr))
    tl.store(nv_ptr + r, tl.sum(chosen.to(tl.int64), 0))


def allocate_triton(confidences, num_drafted, budget, *, check: bool = True, block_s: int = 1024) -> Allocation:
    """Same contract as `allocate_ref`."""
    c, nd, b = allocation_inputs(confidences, num_drafted, budget, check)
    B, K = c.shape
    s = torch.zeros(B, K, dtype=torch.float32, device=c.device)
    nv = torch.zeros(B, dtype=torch.int64, device=c.device)
    if B and K:
        k_pad = triton.next_power_of_2(K)
        block_r = min(128, triton.next_power_of_2(B))
        survival_kernel[(triton.cdiv(B, block_r),)](c, nd, s, B, K, K_PAD=k_pad, BLOCK_R=block_r)
        allocation_kernel[(B,)](s, nd, b, nv, B, K, K_PAD=k_pad,
                                BLOCK_S=min(block_s, triton.next_power_of_2(B * K)))
    return Allocation(s, nv)
