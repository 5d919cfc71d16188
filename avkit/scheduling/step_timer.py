"""The engine's own step (`Engine.step`) at a chosen shape, timed: what `avkit profile` measures.

`SeatedEngine` seats requests in KV slots 0..n-1 of one Engine at a real prefix (written into both models'
caches by their own prefill, once). A shape is one step of the first `rows` requests at `context` cached
tokens: `fed` rows propose their `drafts` real next tokens (`FedDrafter`, no forward) and verify them all;
`model` rows draft one token with the draft model and verify none; `behind` makes the drafter catch up
first. `rewind` (untimed) puts sequences, caches and the drafter's bookkeeping back before every run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from avkit.config import EngineConfig, SamplingConfig
from avkit.drafters.base import Drafter, DraftInput, DraftProposal
from avkit.runtime.engine import Engine
from avkit.runtime.prefill import prefill
from avkit.runtime.request import Request, RunningSeq
from avkit.scheduling.policy import VerifyPolicy
from avkit.step_types import DraftBatch, Load, StepPlan


def write_prefix(model, cache, ids: list[int], rows: int) -> None:
    """Prefill `ids` into slot 0 (keys and values written by the model's prefill), then copy that slot's KV
    into slots 1..rows-1: every row reads a real prefix of len(ids) tokens."""
    if not ids:
        return
    prefill(lambda tokens, q_lens, slots, logits, host=None, prefill=False: model.forward(
        tokens, q_lens, slots, cache, logits=logits, host=host, prefill=prefill), [ids], [0], device=model.device,
        ragged=getattr(model, "ragged_prefill", False))
    cache.k[:, 1:rows], cache.v[:, 1:rows] = cache.k[:, :1], cache.v[:, :1]  # [L, rows-1, H, T, D]
    cache.lengths[:rows] = len(ids)


class FedDrafter(Drafter):
    """Proposes each row's `counts[b]` next tokens of the sequence it continues (`ids`), q one-hot: a
    deterministic drafter that runs no forward (its proposals are built once per shape and kept)."""

    kind = "fed"

    def __init__(self, ids: list[int], vocab_size: int):
        self.ids, self.vocab_size, self.counts = ids, vocab_size, ()
        self._kept: dict = {}

    def propose(self, inp: DraftInput) -> DraftProposal:
        b, k, dev = len(inp.sequences), inp.k, inp.slots.device
        key = (self.counts, b, k, inp.q_width(self.vocab_size), len(inp.sequences[0]))
        if key not in self._kept:
            tokens = torch.zeros(b, k, dtype=torch.int64)  # [B, K]
            for r, (seq, c) in enumerate(zip(inp.sequences, self.counts)):
                tokens[r, :c] = torch.tensor(self.ids[len(seq):len(seq) + c], dtype=torch.int64)
            counts = torch.tensor(self.counts, dtype=torch.int64)  # [B]
            probs = torch.zeros(b, k, key[3])  # [B, K, V] one-hot at the drafts ([B, K, 0] all greedy)
            if key[3]:
                probs.scatter_(2, tokens[:, :, None], (torch.arange(k)[None, :] < counts[:, None]).float()[:, :, None])
            self._kept[key] = DraftProposal(tokens.to(dev), probs.to(dev), torch.ones(b, k, device=dev), {},
                                            counts.to(dev), [self.kind] * b)
        return self._kept[key]

    def commit(self, slots, num_valid, host=None) -> None:
        pass

    def release(self, slot: int) -> None:
        pass


@dataclass
class _Shape(VerifyPolicy):
    """fed shapes verify every draft; model shapes draft one token per row and verify none."""

    model: bool = False
    name: str = "profile"

    def draft_limits(self, load: Load, lag, remaining):
        return [1] * load.num_requests if self.model else None

    def num_verify(self, batch: DraftBatch, load) -> StepPlan:
        return StepPlan(batch.num_drafted * 0 if self.model else batch.num_drafted.clone())


class SeatedEngine:
    """One Engine with `rows` requests seated at a real prefix of `ids` (module note); `step` times its steps."""

    def __init__(self, target, draft, ids: list[int], prefix: int, rows: int, k: int, sampling: SamplingConfig):
        self.ids, self.rows = ids, rows
        self.engine = Engine(target, draft, EngineConfig(k=max(k, 1), concurrency=rows, max_len=prefix + k + 8))
        self.engine.eos = frozenset()  # a profiled step never finishes its requests
        self.model_drafter = self.engine.drafter  # the draft model's DraftModelDrafter, or None
        self.fed = FedDrafter(ids, target.model.config.vocab_size)
        write_prefix(target.model, self.engine.cache, ids[:prefix], rows)
        if self.model_drafter is not None:
            write_prefix(draft.model, self.model_drafter.cache, ids[:prefix], rows)
        sampling = replace(sampling, max_new_tokens=1 << 30)
        self.seqs = [RunningSeq(r, i, [], 0, r.key) for i, r in
                     enumerate(Request(f"profile-{i}", ids[:prefix + 1], sampling) for i in range(rows))]
        self.engine.free_slots = []

    def step(self, rows: int, context: int, drafts: tuple[int, ...] | None = None,
             behind: int = 0) -> tuple[Callable[[], None], Callable[[], object]]:
        """(rewind, run) of one shape (module note): `drafts` per row for a fed step, None for a model step."""
        e, drafter = self.engine, self.model_drafter if drafts is None else self.fed
        policy = _Shape(model=drafts is None)
        seqs = self.seqs[:rows]

        def rewind():
            e.drafter, e.policy = drafter, policy
            self.fed.counts = drafts or ()
            for s in seqs:
                s.tokens[:] = self.ids[:context + 1]  # the cache holds all but the last token
            e.running = {s.req.request_id: s for s in seqs}
            e.cache.lengths[:rows] = context
            if drafts is None:  # positions [0, context) of the draft cache hold the prefix's keys
                drafter._have[:rows] = [context - behind] * rows  # its host mirror of cache.lengths
                drafter.cache.lengths[:rows] = context - behind
        return rewind, e.step
