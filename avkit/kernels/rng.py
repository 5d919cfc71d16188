"""Counter-based random numbers keyed by (seed, request, position, index).

The same integer hash runs in torch (here, the reference) and in Triton (the kernels), so a
random draw depends only on its key — never on batch composition or launch order — and the two
paths agree bit for bit. Hash: lowbias32 (Chris Wellons) applied in a chain over the key words;
all arithmetic is on the low 32 bits (int64 in torch, masked; uint32 in Triton).
Glossary:
  seed      per-request seed (int)
  request   request key (int, stable for the life of a request)
  position  absolute token position in the sequence (so resampling a step reproduces)
  index     vocabulary index or stream id (0 for accept tests)
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
M1 = 0x7FEB352D
M2 = 0x846CA68B
STREAM_ACCEPT = 0  # accept/reject uniform for a draft slot
STREAM_SAMPLE = 1  # residual / bonus token sampling over the vocabulary


def lowbias32(x: torch.Tensor) -> torch.Tensor:
    """[...] int64 holding uint32 values -> [...] int64 holding uint32 hash values."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = (x * M1) & MASK32
    x = x ^ (x >> 15)
    x = (x * M2) & MASK32
    x = x ^ (x >> 16)
    return x


def uniform(seed, request, position, stream, index) -> torch.Tensor:
    """Uniform float32 in (0, 1): the chain h = lowbias32(h ^ w) over the key words (int64 tensors or ints,
    broadcast; h = 0 before the seed), then the top 24 bits: (h >> 8 + 0.5) / 2^24."""
    h = lowbias32(torch.as_tensor(seed, dtype=torch.int64))
    for word in (request, position, stream, index):
        h = lowbias32(h ^ (torch.as_tensor(word, dtype=torch.int64) & MASK32))
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)
