"""Rejection sampling with variable verify lengths, Triton: one program per request. Same signature and random
numbers as the spec and CPU path, `avkit.kernels.rejection_ref.rejection_sample_ref`, so integer outputs agree
bit for bit. Per request: every slot's accept test at once (greedy: one [K+1, V] argmax pass over rows 0..k
only), then one pass over row n that runs the residual's and p_n's exponential races together, so the no-mass
fallback costs no extra read. `avkit.kernels.rng`'s hash chain runs in uint32 (it wraps where the reference
masks), cut where reused: (seed, request) once per request, + (position, stream) per row, + index per element.
Ties keep the lowest index, as torch.argmax does. x draft tokens [B, K], p target probs [B, K+1, V], q draft
probs [B, K, V].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from avkit.kernels import rng
from avkit.kernels.rejection_ref import RejectionResult, rejection_inputs
from avkit.trace import labels as label_rule

_ACCEPT = tl.constexpr(rng.STREAM_ACCEPT)  # jit code may read module globals only as constexpr
_SAMPLE = tl.constexpr(rng.STREAM_SAMPLE)
_M1 = tl.constexpr(rng.M1)
_M2 = tl.constexpr(rng.M2)
_TINY = tl.constexpr(torch.finfo(torch.float32).tiny)  # q is clamped to this, as in the reference


@triton.jit
def _mix(h, w):
    """h <- lowbias32(h ^ w): uint32 h, an int key word (its low 32 bits), broadcast."""
    h = h ^ (tl.cast(w, tl.int64) & 0xFFFFFFFF).to(tl.uint32)
    h = h ^ (h >> 16)
    h = h * tl.full([], _M1, tl.uint32)
    h = h ^ (h >> 15)
    h = h * tl.full([], _M2, tl.uint32)
    return h ^ (h >> 16)


@triton.jit
def _uniform(prefix, index):
    """Finish the chain with a non-negative int `index`; top 24 bits -> float32 in (0, 1), as `rng.uniform`."""
    return ((_mix(prefix, index) >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def _greedy_argmax(p_row, stride_pk, rows, nv, V, K_PAD: tl.constexpr, BLOCK_V: tl.constexpr):
    """[K_PAD] argmax over the vocabulary of target rows 0..nv (later rows are never read)."""
    best = tl.full([K_PAD], float("-inf"), tl.float32)
    arg = tl.zeros([K_PAD], tl.int64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        tile = tl.load(p_row + rows[:, None] * stride_pk + offs[None, :],
                       mask=(rows[:, None] <= nv) & (offs[None, :] < V), other=float("-inf"))
        tile = tile.to(tl.float32)  # [K_PAD, BLOCK_V]
        bmax, barg = tl.max(tile, 1, return_indices=True)  # first index among equal values
        arg = tl.where(bmax > best, barg.to(tl.int64) + start, arg)  # strictly: the earlier block wins ties
        best = tl.maximum(best, bmax)
    return arg


@triton.jit
def _race(p_row, q_row, resid, prefix, V, BLOCK_V: tl.constexpr, LIBDEVICE: tl.constexpr):
    """Exponential race over one vocabulary row; returns the residual's winner, or p's if no mass."""
    best_w = tl.full([], -1.0, tl.float32)
    arg_w = tl.zeros([], tl.int64)
    best_p = tl.full([], -1.0, tl.float32)
    arg_p = tl.zeros([], tl.int64)
    mass = tl.zeros([], tl.float32)
    q_end = tl.where(resid, V, 0)  # q_n is read only after a rejection
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        inb = offs < V
        p = tl.load(p_row + offs, mask=inb, other=0.0).to(tl.float32)  # [BLOCK_V]
        q = tl.load(q_row + offs, mask=offs < q_end, other=0.0).to(tl.float32)
        w = tl.where(resid, tl.maximum(p - q, 0.0), p)
        u = _uniform(prefix, offs)
        # E = -log(u) ~ Exp(1). Bit-exact with torch needs its logf (libdevice) and IEEE division
        # (div_rn; Triton's `/` may round differently); the interpreter has no libdevice.
        if LIBDEVICE:
            e = -libdevice.log(u)
        else:
            e = -tl.log(u)
        kw = tl.where(inb, tl.math.div_rn(w, e), -1.0)
        kp = tl.where(inb, tl.math.div_rn(p, e), -1.0)
        bw, iw = tl.max(kw, 0, return_indices=True)  # first index among equal keys
        bp, ip = tl.max(kp, 0, return_indices=True)
        arg_w = tl.where(bw > best_w, iw.to(tl.int64) + start, arg_w)  # strictly: earlier block wins ties
        arg_p = tl.where(bp > best_p, ip.to(tl.int64) + start, arg_p)
        best_w = tl.maximum(best_w, bw)
        best_p = tl.maximum(best_p, bp)
        mass = tl.maximum(mass, tl.max(w, 0))
    return tl.where(mass > 0, arg_w, arg_p)


@triton.jit
def rejection_kernel(
    target_ptr, stride_tb, stride_tk,  # *[B, K+1, V] target probs, unit stride along V
    draft_ptr, stride_db, stride_dk,  # *[B, K, V] draft probs, unit stride along V
    tokens_ptr, stride_xb,  # *[B, K] int64 draft tokens
    num_verify_ptr, seeds_ptr, keys_ptr, pos_ptr,  # *[B] int64 each
    out_ptr,  # *[B, K+1] int64 output tokens, -1 padded
    num_acc_ptr,  # *[B] int64
    accepted_ptr,  # *[B, K] bool
    target_prob_ptr,  # *[B, K] fp32
    K, V,
    GREEDY: tl.constexpr, K_PAD: tl.constexpr, BLOCK_V: tl.constexpr, LIBDEVICE: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    nv = tl.load(num_verify_ptr + b)
    key_h = _mix(_mix(tl.full([], 0, tl.uint32), tl.load(seeds_ptr + b)), tl.load(keys_ptr + b))
    pos = tl.load(pos_ptr + b)
    p_row = target_ptr + b * stride_tb
    q_row = draft_ptr + b * stride_db
    j = tl.arange(0, K_PAD).to(tl.int64)  # slots (K_PAD >= K + 1)
    is_draft = j < K
    x = tl.load(tokens_ptr + b * stride_xb + j, mask=is_draft, other=0)  # [K_PAD]
    verified = j < nv
    if GREEDY:  # p_j is one-hot at the argmax of whatever scores the rows hold (probs or logits)
        arg = _greedy_argmax(p_row, stride_tk, j, nv, V, K_PAD, BLOCK_V)  # [K_PAD]
        ok = x == arg
        p_x = tl.where(ok, 1.0, 0.0)
    else:
        p_x = tl.load(p_row + j * stride_tk + x, mask=is_draft, other=0.0).to(tl.float32)
        q_x = tl.load(q_row + j * stride_dk + x, mask=is_draft, other=1.0).to(tl.float32)
        u = _uniform(_mix(_mix(key_h, pos + j), _ACCEPT), tl.full([], 0, tl.int64))  # [K_PAD]
        ok = u < tl.math.div_rn(p_x, tl.maximum(q_x, _TINY))  # accept with probability min(1, p/q)
    n = tl.min(tl.where(verified & ~ok, j, nv), 0)  # first rejection among verified slots, else k
    if GREEDY:
        token = tl.sum(tl.where(j == n, arg, 0), 0)
    else:
        resid = n < nv  # rejected at n: residual max(p_n - q_n, 0); else bonus from p_n
        prefix = _mix(_mix(key_h, pos + n), _SAMPLE)
        token = _race(p_row + n * stride_tk, q_row + n * stride_dk, resid, prefix, V, BLOCK_V, LIBDEVICE)
    out = tl.where(j < n, x, tl.where(j == n, token, -1))
    tl.store(out_ptr + b * (K + 1) + j, out, mask=j < K + 1)
    tl.store(num_acc_ptr + b, n)
    tl.store(accepted_ptr + b * K + j, j < n, mask=is_draft)
    tl.store(target_prob_ptr + b * K + j, tl.where(verified, p_x, float("nan")), mask=is_draft)


def rejection_sample_triton(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                            num_verify: torch.Tensor, *, greedy: bool, seeds: torch.Tensor,
                            request_keys: torch.Tensor, positions: torch.Tensor, block_v: int = 2048):
    """Same contract as `avkit.kernels.rejection_ref.rejection_sample_ref`; one program per request."""
    rejection_inputs(target_probs, draft_probs, draft_tokens, num_verify, seeds, request_keys, positions, greedy)
    B, K = draft_tokens.shape
    V = target_probs.shape[-1]
    dev = draft_tokens.device
    tp = target_probs if target_probs.stride(-1) == 1 else target_probs.contiguous()
    dp = draft_probs if draft_probs.stride(-1) == 1 else draft_probs.contiguous()
    # K = 0 (target-only decoding) still launches: buffers get >= 1 column so every pointer is
    # valid; the kernel masks the draft columns away and the results are sliced back to K.
    k1 = max(K, 1)
    x = torch.zeros(B, k1, dtype=torch.int64, device=dev)
    x[:, :K] = draft_tokens
    dp = dp if K and not greedy else tp  # q is never read without drafts, nor by a greedy verify
    ints = [t.to(device=dev, dtype=torch.int64).contiguous()
            for t in (num_verify, seeds, request_keys, positions)]
    out = torch.empty(B, K + 1, dtype=torch.int64, device=dev)
    n = torch.empty(B, dtype=torch.int64, device=dev)
    accepted = torch.empty(B, k1, dtype=torch.bool, device=dev)
    target_prob = torch.empty(B, k1, dtype=torch.float32, device=dev)
    if B:
        rejection_kernel[(B,)](
            tp, tp.stride(0), tp.stride(1), dp, dp.stride(0), dp.stride(1), x, k1, *ints,
            out, n, accepted, target_prob, K, V,
            GREEDY=bool(greedy), K_PAD=triton.next_power_of_2(K + 1),
            BLOCK_V=min(block_v, triton.next_power_of_2(V)), LIBDEVICE=dev.type == "cuda",
            num_warps=4 if greedy else 8)
    observed = label_rule.observed(torch.arange(K, device=dev), ints[0][:, None], n[:, None])  # [B, K]
    return RejectionResult(out, n, accepted[:, :K], observed, target_prob[:, :K])
