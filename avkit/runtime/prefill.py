"""Prefill: write token runs into KV-cache slots without computing any logits.

A ragged prefill forward (`Transformer.ragged_prefill`, the CPU backend) computes real tokens only, so every
run shares the same forwards (at most PREFILL_TOKENS tokens each: one admission's prompts fill the linears' row
blocks together). Elsewhere a padded batch computes every pad through every layer, so only runs of equal length
share a forward. Runs go in chunks of PREFILL_CHUNK tokens; both bounds cap the activations.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch

PREFILL_CHUNK = 512  # tokens per run and forward
PREFILL_TOKENS = 4096  # tokens per ragged forward (activations: ~0.3 GB for the 1.5B target's MLP)


def _groups(runs: list[list[int]], ragged: bool, chunk: int) -> list[list[int]]:
    """Indices of the non-empty runs that share forwards."""
    if not ragged:
        by_len: dict[int, list[int]] = defaultdict(list)
        for i, run in enumerate(runs):
            if run:
                by_len[len(run)].append(i)
        return list(by_len.values())
    groups: list[list[int]] = [[]]
    tokens = 0
    for i, run in enumerate(runs):
        n = min(len(run), chunk)
        if n and groups[-1] and tokens + n > PREFILL_TOKENS:
            groups.append([])
            tokens = 0
        if n:
            groups[-1].append(i)
            tokens += n
    return [g for g in groups if g]


def prefill(forward: Callable, runs: list[list[int]], slots: list[int], chunk: int | None = None,
            device: torch.device | str = "cpu", ragged: bool = False) -> None:
    """Append ``runs[i]`` to cache slot ``slots[i]`` via ``forward(tokens, q_lens, slots, logits, prefill=True)``;
    ``ragged``: the forward computes real tokens only (``Transformer.ragged_prefill``)."""
    chunk = chunk or PREFILL_CHUNK
    for idx in _groups(runs, ragged, chunk):
        for start in range(0, max(len(runs[i]) for i in idx), chunk):
            live = [i for i in idx if len(runs[i]) > start]  # runs with tokens in this chunk
            pieces = [runs[i][start:start + chunk] for i in live]
            width = max(map(len, pieces))
            tokens = torch.tensor([p + [0] * (width - len(p)) for p in pieces], dtype=torch.int64,
                                  device=device)  # [n, S] right-padded
            q_lens = torch.tensor([len(p) for p in pieces], dtype=torch.int64, device=device)  # [n]
            none = torch.zeros(len(live), 0, dtype=torch.int64, device=device)  # logits at no position: no LM head
            forward(tokens, q_lens, torch.tensor([slots[i] for i in live], dtype=torch.int64, device=device), none,
                    prefill=True)
