"""Triton device functions for the counter-based RNG of `avkit.kernels.rng` (same hash, same bits).

The torch reference holds uint32 values in int64 and masks after every multiply; here the words
are uint32 and wrap on their own. The chain lowbias32(... lowbias32(lowbias32(seed) ^ request)
^ position) ^ stream) ^ index) is cut where kernels reuse it: `key_hash` once per request,
`stream_hash` once per (slot, stream), and `uniform_from_prefix` once per element.
Glossary:
  key_h     chain over (seed, request): one uint32 per request
  prefix    chain over (seed, request, position, stream): one uint32 per row
  index     the last key word (vocabulary index, or 0 for accept tests)
"""

from __future__ import annotations

import triton
import triton.language as tl

from avkit.kernels import rng

_M1 = tl.constexpr(rng.M1)  # jit code may read module globals only as constexpr
_M2 = tl.constexpr(rng.M2)


@triton.jit
def lowbias32(x):
    """uint32 -> uint32 (Chris Wellons' lowbias32; multiplies wrap mod 2^32)."""
    x = x ^ (x >> 16)
    x = x * tl.full([], _M1, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full([], _M2, tl.uint32)
    x = x ^ (x >> 16)
    return x


@triton.jit
def key_hash(seed, request):
    """int64 seed, request (scalars or blocks) -> uint32 chain over the first two key words."""
    h = lowbias32((seed.to(tl.int64) & 0xFFFFFFFF).to(tl.uint32))
    return lowbias32(h ^ (request.to(tl.int64) & 0xFFFFFFFF).to(tl.uint32))


@triton.jit
def stream_hash(key_h, position, stream: tl.constexpr):
    """Continue `key_hash` with an int64 position and a constant stream id -> uint32 prefix."""
    h = lowbias32(key_h ^ (position.to(tl.int64) & 0xFFFFFFFF).to(tl.uint32))
    return lowbias32(h ^ tl.full([], stream, tl.uint32))


@triton.jit
def uniform_from_prefix(prefix, index):
    """Finish the chain with a non-negative int `index`; top 24 bits -> float32 in (0, 1)."""
    h = lowbias32(prefix ^ index.to(tl.uint32))
    return ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
