"""After verification: append each request's emitted tokens, apply stops, roll both caches back."""

from __future__ import annotations

import torch

from avkit.runtime.request import FINISH_LENGTH, FINISH_STOP, StepOutput
from avkit.runtime.running import RunningSeq


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
    cache.truncate(slots, torch.minimum(cache.lengths[slots], valid), check=False)
    if drafter is not None:
        drafter.commit(slots, valid, ([s.slot for s in batch], valid_ids))


__all__ = ["append_tokens", "roll_back"]
