"""The Drafter protocol: who proposes the K draft tokens that the target verifies.

A drafter keeps its own per-slot state (the draft model's KV cache, a suffix tree) and is told
three things by the engine: propose drafts for these sequences, these tokens are now final
(`commit`), this slot is gone (`release`). It never sees target probabilities.
Glossary:
  slot         the engine's KV-cache slot of a request (shared with the target cache)
  num_draft    the most drafts the engine wants from a request this step (<= K; fewer near the
               end of max_new_tokens or max_len)
  num_drafted  how many the drafter actually proposed (<= num_draft; a cache drafter may have none)
  probs        the distribution each draft token was drawn from, after top-p (a deterministic
               drafter gives one-hot rows): rejection sampling needs q(x) and q for the residual;
               an all-greedy batch gets none (width 0): its verify compares tokens with argmax p
  features     lossless features of the UNtruncated draft distribution (avkit.features)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol
from collections.abc import Callable

import torch


@dataclass(frozen=True)
class DraftInput:
    slots: torch.Tensor  # [B] int64 engine slots, ascending
    sequences: list[list[int]]  # per request: prompt + output so far (read-only; the last token is new)
    num_draft: torch.Tensor  # [B] int64, drafts wanted per request (0 allowed)
    temperature: torch.Tensor  # [B] float32 (0 = greedy)
    top_p: torch.Tensor  # [B] float32
    seeds: torch.Tensor  # [B] int64 rng seed per request
    request_keys: torch.Tensor  # [B] int64 rng key per request
    positions: torch.Tensor  # [B] int64 = len(sequences[b]): absolute position of draft slot 0
    # Optional early stop, asked after each draft pass j with the lossless features so far
    # (DraftBatch: name -> [B, j], num_drafted [B]) -> [B] bool "draft one more", or None (no stop).
    # Decides slot j from q_0..q_{j-1} only, never from the drawn x_{j-1}'s probability: lossless.
    continue_drafting: Callable | None = None
    max_draft: int | None = None  # the most drafts any row wants (host bookkeeping; None: read num_draft)
    slot_ids: tuple[int, ...] | None = None  # `slots` as host ints (the engine's bookkeeping)
    num_draft_ids: tuple[int, ...] | None = None  # `num_draft` as host ints
    # (slope [1], intercepts [K]) float32 on the device: the estimator's coefficients for the confidence
    # kernel in each draft pass (DraftProposal.confidences), or None (the policy predicts from features)
    coefficients: tuple[torch.Tensor, torch.Tensor] | None = None
    greedy: bool | None = None  # host: True every request has T = 0, False none has (None: a mix, or unknown)
    nucleus: bool | None = None  # host: some request has top_p < 1 (None: unknown)

    def q_width(self, vocab_size: int) -> int:
        """The last dimension of a proposal's `probs`: 0 when every row is greedy (a greedy verify accepts
        iff x_j = argmax p_j and never reads q, so no [B, K, V] buffer is filled), else `vocab_size`."""
        return 0 if self.greedy else vocab_size

    def host_slots(self) -> tuple[int, ...]:
        return self.slot_ids if self.slot_ids is not None else tuple(self.slots.tolist())

    def host_num_draft(self) -> tuple[int, ...]:
        return self.num_draft_ids if self.num_draft_ids is not None else tuple(self.num_draft.tolist())

    @property
    def k(self) -> int:
        if self.max_draft is not None:
            return self.max_draft
        return int(self.num_draft.max()) if len(self.sequences) else 0


@dataclass(frozen=True)
class DraftProposal:
    tokens: torch.Tensor  # [B, K] int64 draft tokens (0 beyond num_drafted)
    probs: torch.Tensor  # [B, K, V] float32 truncated draft distributions (0 beyond num_drafted);
    # [B, K, 0] when DraftInput.greedy is True (DraftInput.q_width): greedy verification reads no q
    q_sampled: torch.Tensor  # [B, K] float32 q_j(x_j) under probs (LOSSY feature; trace only)
    features: dict[str, torch.Tensor]  # name -> [B, K] float32 lossless features (NaN beyond num_drafted)
    num_drafted: torch.Tensor  # [B] int64
    kind: list[str]  # [B] drafter kind per request, the trace's `drafter` column: "model", "suffix"
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # optional trace columns, [B, K]:
    # head_conf (trained head), match_len / cache_score (cache drafts); NaN = null
    confidences: torch.Tensor | None = None  # [B, K] float32 predictions made in the draft passes, or None
    cache_rows: torch.Tensor | None = None  # [B] bool, rows a deterministic cache drafted (kind "suffix"), or None

    @classmethod
    def empty(cls, inp: DraftInput, vocab_size: int, kind: str, features: tuple[str, ...], device) -> DraftProposal:
        """Nothing drafted yet, [B, inp.k] (probs [B, K, inp.q_width(V)], `features` NaN): a drafter's buffers."""
        B, K, dev = len(inp.sequences), inp.k, device
        return cls(torch.zeros(B, K, dtype=torch.int64, device=dev), torch.zeros(B, K, inp.q_width(vocab_size),
                   device=dev), torch.zeros(B, K, device=dev), {n: torch.full((B, K), float("nan"), device=dev)
                   for n in features}, torch.zeros(B, dtype=torch.int64, device=dev), [kind] * B)


class Drafter(Protocol):
    """Drafters subclass this (or define every member): the engine reads `kind` and `forward_s` directly."""

    kind: str  # "model": a draft model's forwards, which the verify policy's draft gate may skip
    forward_s: float = 0.0  # wall time inside model forwards so far (the engine's overhead stats)
    passes: int = 0  # draft forwards the last `propose` ran (host count; the step's shape for the cost model)
    draft_rows: int = 0  # requests the last `propose`'s first draft forward ran over (host count)
    lookups: int = 0  # requests the last `propose` looked up in a cache (host count)
    plans: bool = False  # True: propose() already trimmed each row to the prefix its own plan verifies (HVD's
    #                      joint router), so the engine's policy does not plan a second time

    def propose(self, inp: DraftInput) -> DraftProposal:
        """Up to num_draft[b] draft tokens per request, all requests batched."""
        ...

    def commit(self, slots: torch.Tensor, num_valid: torch.Tensor,
               host: tuple[list[int], list[int]] | None = None) -> None:
        """The first num_valid[b] tokens of slot b's sequence are final: drop any state beyond them.
        host: (slots, num_valid) as host ints when the caller has them (no read back)."""
        ...

    def lag(self, slot: int, length: int) -> int:
        """Tokens of the length-`length` sequence in `slot` the drafter has not seen, which drafting it next
        costs a catch-up over (scheduling/batch_schedule.py). Default 0: a drafter without a cache of its own."""
        return 0

    def observe_final(self, slot: int, sequence: list[int]) -> None:
        """The request in `slot` finished with `sequence` (prompt + output), before `release`; a drafter that
        learns from whole responses (the suffix cache) keeps it. Default: nothing."""

    def release(self, slot: int) -> None:
        """The request in `slot` left the batch."""
        ...


__all__ = ["DraftInput", "DraftProposal", "Drafter"]
