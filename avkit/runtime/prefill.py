"""Prefill: write token runs into KV-cache slots without computing any logits.

Runs of equal length share a forward; others get their own. A padded batch of prompts computes
every pad position through every layer (8 prompts of 100..700 tokens padded to 700 cost ~2x the
real tokens), while one prompt per forward wastes nothing and still runs large matmuls. Chunks
bound the attention mask and activations of very long prompts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch

PREFILL_CHUNK = 512  # tokens per forward


def prefill(forward: Callable, runs: list[list[int]], slots: list[int], chunk: int | None = None,
            device: torch.device | str = "cpu") -> None:
    """Append ``runs[i]`` to cache slot ``slots[i]`` via ``forward(tokens, q_lens, slots, logits, prefill=True)``."""
    chunk = chunk or PREFILL_CHUNK
    groups: dict[int, list[int]] = defaultdict(list)  # length -> indices of runs
    for i, run in enumerate(runs):
        if run:
            groups[len(run)].append(i)
    for length, idx in groups.items():
        tokens = torch.tensor([runs[i] for i in idx], dtype=torch.int64, device=device)  # [n, length]
        group_slots = torch.tensor([slots[i] for i in idx], dtype=torch.int64, device=device)  # [n]
        none = torch.zeros(len(idx), 0, dtype=torch.int64, device=device)  # logits at no position: no LM head
        for start in range(0, length, chunk):
            piece = tokens[:, start:start + chunk]  # [n, S]
            forward(piece, torch.full((len(idx),), piece.shape[1], device=device), group_slots, none, prefill=True)
