"""Triton device functions for the counter-based RNG of `avkit.kernels.rng` (same hash, same bits).

The torch reference holds uint32 values in int64 and masks after every multiply; here the hash
is uint32 and wraps on its own (key words keep their low 32 bits, as `& MASK32` does). The chain
h = lowbias32(h ^ w) over the words (seed, request, position, stream, index), from h = 0, is cut
where kernels reuse it: `key_hash` once per request, `stream_hash` once per (slot, stream), and
`uniform_from_prefix` once per element. `uniform_triton` is the chain as a launcher (reference:
`avkit.kernels.rng.uniform`).
Glossary:
  key_h     chain over (seed, request): one uint32 per request
  prefix    chain over (seed, request, position, stream): one uint32 per row
  index     the last key word (vocabulary index, or 0 for accept tests)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from avkit.kernels import rng

_M1 = tl.constexpr(rng.M1)  # jit code may read module globals only as constexpr
_M2 = tl.constexpr(rng.M2)


@triton.jit
def mix(h, w1, w2, ROUNDS: tl.constexpr):
    """h <- lowbias32(h ^ w) for w in (w1, w2)[:ROUNDS]: uint32 h, int key words, all broadcast.

    lowbias32 (Chris Wellons) is written out once, inside a static loop, so that the chain is one
    device call (cheap in Triton's interpreter, identical once compiled); multiplies wrap mod 2^32.
    """
    for i in tl.static_range(ROUNDS):
        if i == 0:
            h = h ^ (tl.cast(w1, tl.int64) & 0xFFFFFFFF).to(tl.uint32)
        else:
            h = h ^ (tl.cast(w2, tl.int64) & 0xFFFFFFFF).to(tl.uint32)
        h = h ^ (h >> 16)
        h = h * tl.full([], _M1, tl.uint32)
        h = h ^ (h >> 15)
        h = h * tl.full([], _M2, tl.uint32)
        h = h ^ (h >> 16)
    return h


@triton.jit
def key_hash(seed, request):
    """int64 seed, request (scalars or blocks) -> uint32 chain over the first two key words."""
    return mix(tl.full([], 0, tl.uint32), seed, request, 2)  # lowbias32(0 ^ seed) first


@triton.jit
def stream_hash(key_h, position, stream):
    """Continue `key_hash` with an int64 position and a stream id -> uint32 prefix."""
    return mix(key_h, position, stream, 2)


@triton.jit
def uniform_from_prefix(prefix, index):
    """Finish the chain with a non-negative int `index`; top 24 bits -> float32 in (0, 1)."""
    h = mix(prefix, index, index, 1)
    return ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def uniform_kernel(
    seed_ptr, request_ptr, position_ptr, index_ptr,  # *[N] int64 key words
    out_ptr,  # *[N] fp32
    N,
    STREAM: tl.constexpr, BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < N
    seed = tl.load(seed_ptr + offs, mask=inb, other=0)
    key_h = key_hash(seed, tl.load(request_ptr + offs, mask=inb, other=0))
    prefix = stream_hash(key_h, tl.load(position_ptr + offs, mask=inb, other=0), STREAM)
    u = uniform_from_prefix(prefix, tl.load(index_ptr + offs, mask=inb, other=0))
    tl.store(out_ptr + offs, u, mask=inb)


def uniform_triton(seed, request, position, stream: int, index, *, block: int = 1024):
    """`avkit.kernels.rng.uniform` on device, for [N] int64 key words (index >= 0) -> [N] float32."""
    words = torch.broadcast_tensors(*(torch.as_tensor(w, dtype=torch.int64)
                                      for w in (seed, request, position, index)))
    words = [w.reshape(-1).contiguous() for w in words]
    out = torch.empty_like(words[0], dtype=torch.float32)
    n = out.numel()
    if n:
        uniform_kernel[(triton.cdiv(n, block),)](*words, out, n, STREAM=int(stream), BLOCK=block)
    return out
