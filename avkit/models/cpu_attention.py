"""The CPU backend's attention (``cpu_attention.cpp``): each query row alone over its own causal key span.

A token's attention output, hence its logits, is then bit-identical whether it is decoded alone, verified in a
(1 + k)-token forward or batched beside requests of other lengths; bf16 SDPA's blocking follows the call's
shapes, and a flipped near-tie in the LM head changes a greedy token. SDPA's maths (fp32 scores and softmax, bf16
in and out) in an order fixed by the key span alone, keys and values read in place from the cache. With the
packed linears (cpu_linear.py) the whole bf16 forward is batch-invariant. Elsewhere the forward calls SDPA.
"""

from __future__ import annotations

import torch

from avkit.models import native

MAX_GROUP = 16  # query heads per kv head the kernel takes (GMAX in the .cpp)


def available() -> bool:
    return native.load("attention") is not None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, ends: torch.Tensor,
              scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v per query row over keys [0, ends[b, s]) of cache slot ``slots[b]`` (ends 0: a pad).

    q [B, S, H, D] bf16; k, v: one layer of the cache [max_batch, H_kv, T, D] bf16, contiguous (GQA: query head
    h reads kv head h // (H / H_kv)); slots [B] int64; ends [B, S] int64 in [0, T] -> [B, S, H, D] bf16.
    """
    return native.load("attention").attention_bf16(q, k, v, slots, ends, scale)
