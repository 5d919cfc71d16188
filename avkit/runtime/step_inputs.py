"""The per-step tensors of a batch, built from the engine's host bookkeeping (no device reads)."""

from __future__ import annotations

from dataclasses import replace

import torch

from avkit.drafters.base import DraftInput, DraftProposal
from avkit.runtime.running import RunningSeq


def draft_input(batch: list[RunningSeq], k: int, max_len: int, drafting: bool, device) -> DraftInput:
    """Drafts wanted per request and its sampling tensors; counts stay on the host too (`*_ids`)."""
    lens = [len(s.tokens) for s in batch]
    # A step emits up to k + 1 tokens and feeds k + 1 positions into a cache that holds len - 1.
    wanted = tuple(max(0, min(s.req.sampling.max_new_tokens - s.num_output - 1, max_len - n, k)) if drafting else 0
                   for s, n in zip(batch, lens))
    slots = tuple(s.slot for s in batch)
    dev = lambda values, dtype=torch.int64: torch.tensor(values, dtype=dtype).to(device)
    return DraftInput(
        slots=dev(slots), sequences=[s.tokens for s in batch], num_draft=dev(wanted),
        temperature=dev([s.req.sampling.temperature for s in batch], torch.float32),
        top_p=dev([s.req.sampling.top_p for s in batch], torch.float32),
        seeds=dev([s.seed for s in batch]), request_keys=dev([s.key for s in batch]), positions=dev(lens),
        max_draft=max(wanted, default=0), slot_ids=slots, num_draft_ids=wanted,
        greedy=_all_or_none([s.req.sampling.temperature == 0 for s in batch]),
        nucleus=any(s.req.sampling.top_p < 1 for s in batch))


def _all_or_none(flags: list[bool]) -> bool | None:
    """True if every flag is set, False if none is, None for a mix (DraftInput.greedy)."""
    return True if all(flags) else (False if not any(flags) else None)


def limit_drafts(inp: DraftInput, limits: list[int], device) -> DraftInput:
    """`inp` with each request's drafts capped at limits[b] (the policy's `draft_limits`)."""
    wanted = tuple(min(w, max(0, int(m))) for w, m in zip(inp.num_draft_ids, limits))
    return replace(inp, num_draft=torch.tensor(wanted, dtype=torch.int64).to(device),
                   max_draft=max(wanted, default=0), num_draft_ids=wanted)


def no_drafts(batch_size: int, vocab_size: int, device) -> DraftProposal:
    """An empty proposal: target-only decoding through the same step."""
    B, dev = batch_size, device
    return DraftProposal(torch.zeros(B, 0, dtype=torch.int64, device=dev), torch.zeros(B, 0, vocab_size, device=dev),
                         torch.zeros(B, 0, device=dev), {}, torch.zeros(B, dtype=torch.int64, device=dev),
                         ["none"] * B)


def top_k_min_p(batch: list[RunningSeq], device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-request top-k / min-p as [B, 1] for the verifier's distribution; (None, None) when all are off.
    Only the target's distribution needs them: rejection sampling emits it whatever the draft proposed."""
    if not any(s.req.sampling.top_k or s.req.sampling.min_p for s in batch):
        return None, None
    top_k = torch.tensor([s.req.sampling.top_k for s in batch], dtype=torch.int64).to(device)
    min_p = torch.tensor([s.req.sampling.min_p for s in batch], dtype=torch.float32).to(device)
    return top_k[:, None], min_p[:, None]


__all__ = ["draft_input", "limit_drafts", "no_drafts", "top_k_min_p"]
