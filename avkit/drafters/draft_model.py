"""The model drafter: a small LM proposes K tokens per request, K forwards batched over requests.

Its KV cache mirrors the target's slots. Invariant between steps: the cache holds a prefix of the
sequence. A step first catches up on what it lacks (a new prompt, or the draft x_K and the bonus
token after a fully accepted step: never fed, since x_K is sampled from the last forward), then
runs K forwards of one token each:

    forward 1 feeds seq[L:]  -> q_1 -> x_1      (L = cached length; 1 or 2 tokens)
    forward i feeds x_{i-1}  -> q_i -> x_i      (i = 2..K)

After verification `commit` truncates the cache to the accepted prefix, so nothing is recomputed.
"""

from __future__ import annotations

import time

import torch

from avkit.drafters.base import Drafter, DraftInput, DraftProposal
from avkit.features import draft_features
from avkit.runtime.prefill import prefill
from avkit.runtime.sampling import probs_from_logits, sample_tokens
from avkit.step_types import DraftBatch

_LONG_CATCH_UP = 2  # rows lacking more tokens than this are prefilled row by row first


class DraftModelDrafter(Drafter):
    kind = "model"

    def __init__(self, draft, max_batch: int, max_len: int):
        self.model = draft.model
        self.cache = self.model.new_cache(max_batch, max_len)
        self.device = self.cache.lengths.device
        self.forward_s = 0.0  # wall time inside model forwards (for the engine's overhead stats)

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def _forward(self, tokens, q_lens, slots, logits):
        t0 = time.perf_counter()
        out = self.model.forward(tokens, q_lens, slots, self.cache, logits=logits)
        self.forward_s += time.perf_counter() - t0
        return out

    def _prefill(self, inp: DraftInput) -> None:
        """Feed all but the last token of rows that lag far behind (new prompts); no logits."""
        lengths = self.cache.lengths[inp.slots].tolist()
        rows = [b for b, (seq, have) in enumerate(zip(inp.sequences, lengths)) if len(seq) - have > _LONG_CATCH_UP]
        slots = inp.slots.tolist()
        prefill(self._forward, [inp.sequences[b][lengths[b]:-1] for b in rows], [slots[b] for b in rows],
                device=self.device)

    def _first_inputs(self, inp: DraftInput) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, S<=2] right-padded tokens the cache lacks, and their counts [B]."""
        lengths = self.cache.lengths[inp.slots].tolist()
        feed = [seq[have:] for seq, have in zip(inp.sequences, lengths)]
        width = max(len(f) for f in feed)
        tokens = torch.tensor([f + [0] * (width - len(f)) for f in feed], dtype=torch.int64)  # B rows of <= 2
        q_lens = torch.tensor([len(f) for f in feed], dtype=torch.int64)
        return tokens.to(self.device), q_lens.to(self.device)

    @torch.inference_mode()
    def propose(self, inp: DraftInput) -> DraftProposal:
        B, K, V, dev = len(inp.sequences), inp.k, self.vocab_size, self.device
        tokens_out = torch.zeros(B, K, dtype=torch.int64, device=dev)  # [B, K]
        probs_out = torch.zeros(B, K, V, device=dev)  # [B, K, V]
        q_sampled = torch.zeros(B, K, device=dev)  # [B, K]
        feats: dict[str, torch.Tensor] = {}
        drafted = torch.zeros(B, dtype=torch.int64, device=dev)  # [B] drafts proposed so far
        active = torch.nonzero(inp.num_draft > 0).squeeze(-1)  # rows still drafting
        if K > 0:
            self._prefill(inp)
            tokens, q_lens = self._first_inputs(inp)
            tokens, q_lens = tokens[active], q_lens[active]
        for i in range(K):
            logits = self._forward(tokens, q_lens, inp.slots[active], "last")  # [b, V]
            temp, top_p = inp.temperature[active], inp.top_p[active]
            for name, value in draft_features(logits, temp).items():  # lossless, before top-p
                feats.setdefault(name, torch.full((B, K), float("nan"), device=dev))[active, i] = value
            q = probs_from_logits(logits, temp, top_p)  # [b, V] what x_i is drawn from
            x = sample_tokens(q, inp.seeds[active], inp.request_keys[active], inp.positions[active] + i)
            tokens_out[active, i] = x
            probs_out[active, i] = q
            q_sampled[active, i] = q.gather(-1, x[:, None]).squeeze(-1)
            drafted[active] = i + 1
            keep = inp.num_draft[active] > i + 1  # rows that want another draft
            if inp.continue_drafting is not None and i + 1 < K:
                so_far = DraftBatch({n: f[:, : i + 1] for n, f in feats.items()}, drafted.clone())
                more = inp.continue_drafting(so_far)  # [B] the policy's lossless early stop, or None
                if more is not None:
                    keep &= more.to(dev)[active]
            active, tokens, q_lens = active[keep], x[keep, None], torch.ones_like(x[keep])
            if active.numel() == 0:
                break
        return DraftProposal(tokens_out, probs_out, q_sampled, feats, drafted, [self.kind] * B)

    def commit(self, slots: torch.Tensor, num_valid: torch.Tensor) -> None:
        have = self.cache.lengths[slots]
        self.cache.truncate(slots, torch.minimum(have, num_valid))

    def release(self, slot: int) -> None:
        self.cache.free(slot)


__all__ = ["DraftModelDrafter"]
