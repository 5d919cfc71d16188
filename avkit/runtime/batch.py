"""One engine step's host side: the per-step tensors built from the running sequences (no device reads)
and what the step commits back (tokens, stops, both caches rolled back)."""

from __future__ import annotations

from dataclasses import replace

import torch

from avkit.drafters.base import DraftInput, DraftProposal
from avkit.runtime.request import FINISH_LENGTH, FINISH_STOP, RunningSeq, StepOutput


def draft_input(batch: list[RunningSeq], k: int, max_len: int, drafting: bool, device) -> DraftInput:
    """Drafts wanted per request and its sampling tensors; counts stay on the host too (`*_ids`)."""
    lens = [len(s.tokens) for s in batch]
    # A step emits up to k + 1 tokens and feeds k + 1 positions into a cache that holds len - 1.
    wanted = tuple(max(0, min(s.req.sampling.max_new_tokens - s.num_output - 1, max_len - n, k)) if drafting else 0
                   for s, n in zip(batch, lens))
    slots = tuple(s.slot for s in batch)
    greedy = [s.req.sampling.temperature == 0 for s in batch]
    dev = lambda values, dtype=torch.int64: torch.tensor(values, dtype=dtype).to(device)
    return DraftInput(
        slots=dev(slots), sequences=[s.tokens for s in batch], num_draft=dev(wanted),
        temperature=dev([s.req.sampling.temperature for s in batch], torch.float32),
        top_p=dev([s.req.sampling.top_p for s in batch], torch.float32),
        seeds=dev([s.seed for s in batch]), request_keys=dev([s.key for s in batch]), positions=dev(lens),
        max_draft=max(wanted, default=0), slot_ids=slots, num_draft_ids=wanted,
        greedy=True if all(greedy) else (False if not any(greedy) else None),  # None: a mix
        nucleus=any(s.req.sampling.top_p < 1 for s in batch))


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


def append_tokens(batch: list[RunningSeq], emitted: list[list[int]], accepted: list[int], eos: frozenset,
                  max_len: int) -> list[StepOutput]:
    """Request r gets its n_r accepted drafts + 1 recovered/bonus token, cut at a stop id or its limits."""
    outs = []
    for seq, row, n in zip(batch, emitted, accepted):
        new = row[: n + 1]
        reason = None
        stops = eos | set(seq.req.stop_token_ids)
        cut = next((i for i, t in enumerate(new) if t in stops), None)
        if cut is not None:
            new, reason = new[: cut + 1], FINISH_STOP
        room = seq.req.sampling.max_new_tokens - seq.num_output
        if len(new) >= room:
            new, reason = new[:room], reason or FINISH_LENGTH
        seq.tokens.extend(new)
        seq.steps += 1
        if reason is None and len(seq.tokens) >= max_len:
            reason = FINISH_LENGTH
        outs.append(StepOutput(seq.req.request_id, new, reason is not None, reason))
    return outs


def roll_back(batch: list[RunningSeq], slots: torch.Tensor, cache, drafter) -> None:
    """The target cache held len - 1 tokens, then got 1 + k_r: keep the accepted prefix, len_new - 1
    (and the drafter likewise), computed from the host's own lengths."""
    valid_ids = [len(s.tokens) - 1 for s in batch]
    valid = torch.tensor(valid_ids, dtype=torch.int64).to(cache.lengths.device)  # [B]
    cache.truncate(slots, valid)
    if drafter is not None:
        drafter.commit(slots, valid, ([s.slot for s in batch], valid_ids))
