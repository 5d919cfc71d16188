"""The CPU backend's attention: each query row computed alone over its own causal key span (``cpu_attention.cpp``).

Batch invariance: a token's attention output, hence its logits, is bit-identical whether the token is decoded
alone, verified inside a (1 + k)-token forward, or batched beside requests of other lengths. torch's SDPA does
not give that in bf16 (its blocking follows the call's shapes and it takes another path with a mask), and a
flipped near-tie in the LM head then changes a greedy token. The kernel computes SDPA's maths (fp32 scores,
fp32 softmax, bf16 in and out) in an order fixed by the query's key span alone, reading keys and values in
place from the cache (no gather of the batch's slots, no [B, 1, G*S, span] mask). With the packed linears
(cpu_linear.py: each output row summed in one fixed order) the whole bf16 forward is batch-invariant.

Used for bf16 models on a CPU where the kernel loads (native.py); elsewhere, and on CUDA, the forward calls
SDPA unchanged.

Glossary
--------
ends    [B, S] int64: query (b, s) attends to keys [0, ends[b, s]) of its slot (its position + 1); 0 for pads
        (right-padding queries: zeros out, no work)
"""

from __future__ import annotations

import torch

from avkit.models import native

MAX_GROUP = 16  # query heads per kv head the kernel takes (GMAX in the .cpp)


def available() -> bool:
    return native.load("attention") is not None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, ends: torch.Tensor,
              scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v per query row over keys [0, ends[b, s]) of cache slot ``slots[b]``.

    q [B, S, H, D] bf16; k, v: one layer of the cache [max_batch, H_kv, T, D] bf16, contiguous (GQA: query head
    h reads kv head h // (H / H_kv)); slots [B] int64; ends [B, S] int64 in [0, T] -> [B, S, H, D] bf16.
    """
    return native.load("attention").attention_bf16(q, k, v, slots, ends, scale)
