"""Draft confidence, Triton: logit(q_max), q_max, q_2nd, entropy and sigma(slope * f + intercept)
in one pass.

Each program owns one row (a draft slot) and streams its logits once in vocabulary blocks,
keeping the running max m, the runner-up m2 and two sums in the units of m (an online softmax):
  s_o  the mass of every token but the current top, sum exp(l_z - m)
  t    sum_z exp(l_z - m) (l_z - m), for the entropy
When a block raises the max from m to m', the old sums are rescaled by alpha = exp(m - m'), the
old top joins the others (+alpha), and t picks up (m - m') times the old partition function
(1 + s_o), since (l - m') = (l - m) + (m - m'). Ties keep the earlier index as the top, which
leaves the sums unchanged. Spec and CPU path: `avkit.kernels.confidence_ref.confidence_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from avkit.features import CLAMP
from avkit.kernels.confidence_ref import Confidence, confidence_inputs

_CLAMP = tl.constexpr(CLAMP)


@triton.jit
def confidence_kernel(
    logits_ptr,  # *[rows, V] fp32/bf16, unit stride along V
    stride_row,  # elements between rows
    inv_temp_ptr,  # *[rows] fp32, 1 / temperature
    pos_ptr,  # *[rows] int64, draft position (intercept index)
    intercept_ptr,  # *[K] fp32
    slope_ptr,  # *[1] fp32 (a device tensor: no host read of the live coefficients)
    logit_ptr, qmax_ptr, q2nd_ptr, entropy_ptr, conf_ptr, margin_ptr, nnlq_ptr,  # *[rows] fp32 outputs
    V,  # vocabulary size
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride_row
    inv_t = tl.load(inv_temp_ptr + row)
    neg_inf = float("-inf")
    m = tl.full([], neg_inf, tl.float32)  # running max
    m2 = tl.full([], neg_inf, tl.float32)  # running second largest (a tie for the top counts)
    s_o = tl.zeros([], tl.float32)  # others' mass / exp(m)
    t = tl.zeros([], tl.float32)  # sum e (l - m)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(base + offs, mask=offs < V, other=neg_inf).to(tl.float32) * inv_t  # [BLOCK_V]
        bm, barg = tl.max(x, 0, return_indices=True)  # first index among equal values
        grew = bm > m  # strictly: on a tie the earlier top stays the top
        b2 = tl.max(tl.where(offs == start + barg, neg_inf, x), 0)  # this block's runner-up
        m2 = tl.where(grew, tl.maximum(m, b2), tl.maximum(m2, bm))
        m_new = tl.maximum(m, bm)
        alpha = tl.where(grew, tl.exp(m - m_new), 1.0)  # 0 on the first finite block
        shift = tl.where(m > neg_inf, m - m_new, 0.0)  # (m - m'), 0 before any finite logit
        t = alpha * (t + shift * (1.0 + s_o))
        s_o = tl.where(grew, alpha * (s_o + 1.0), s_o)  # the old top joins the others
        e = tl.where(x > neg_inf, tl.exp(x - m_new), 0.0)  # [BLOCK_V]
        top = tl.where(grew, start + barg, -1)  # the new top, if in this block, is not an "other"
        s_o += tl.sum(tl.where(offs == top, 0.0, e), 0)
        t += tl.sum(tl.where(e > 0, e * (x - m_new), 0.0), 0)
        m = m_new
    z = 1.0 + s_o
    # log1p(s_o) without cancellation for tiny s_o (Goldberg): log(z) * s_o / (z - 1).
    log1p_s = tl.where(z == 1.0, s_o, tl.log(z) * (s_o / (z - 1.0)))
    entropy = tl.maximum(log1p_s - t / z, 0.0)
    logit = tl.minimum(tl.maximum(-tl.log(s_o), -_CLAMP), _CLAMP)
    beta = tl.load(intercept_ptr + tl.load(pos_ptr + row))
    tl.store(logit_ptr + row, logit)
    tl.store(qmax_ptr + row, 1.0 / z)
    tl.store(q2nd_ptr + row, tl.where(m2 > neg_inf, tl.exp(m2 - m) / z, 0.0))
    tl.store(entropy_ptr + row, entropy)
    tl.store(conf_ptr + row, tl.sigmoid(tl.load(slope_ptr) * logit + beta))
    tl.store(margin_ptr + row, tl.minimum(tl.maximum(m - m2, -_CLAMP), _CLAMP))  # m2 = -inf -> +CLAMP
    tl.store(nnlq_ptr + row, tl.minimum(tl.maximum(-tl.log(log1p_s), -_CLAMP), _CLAMP))


def confidence_triton(logits: torch.Tensor, temperature, positions, slope, intercepts, *, check: bool = True,
                      block_v: int = 4096, num_warps: int = 8) -> Confidence:
    """Same contract as `confidence_ref`; one program per row, logits read once."""
    x, inv_t, pos, omega, beta, lead = confidence_inputs(logits, temperature, positions, slope, intercepts, check)
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, V = x.shape
    outs = [torch.empty(rows, dtype=torch.float32, device=x.device) for _ in Confidence._fields]
    if rows:
        block = min(block_v, triton.next_power_of_2(V))
        confidence_kernel[(rows,)](x, x.stride(0), inv_t, pos, beta, omega, *outs, V,
                                   BLOCK_V=block, num_warps=num_warps)
    return Confidence(*(o.reshape(lead) for o in outs))
