"""The model drafter: a small LM proposes K tokens per request, K forwards batched over requests.

Its KV cache mirrors the target's slots. Invariant between steps: the cache holds a prefix of the
sequence. A step first catches up, for the rows that draft in it, on what they lack (a new prompt, the
draft x_K and the bonus token after a fully accepted step: never fed, since x_K is sampled from the
last forward, or every token decoded while the row did not draft), then runs K forwards of one
token each:

    forward 1 feeds seq[L:]  -> q_1 -> x_1      (L = cached length; 1 or 2 tokens)
    forward i feeds x_{i-1}  -> q_i -> x_i      (i = 2..K)

After verification `commit` truncates the cache to the accepted prefix, so nothing is recomputed.
Catch-up is lazy: a row that does not draft (a schedule's K = 0, the draft gate off) costs the drafter
nothing, and the step that drafts it again feeds the tokens it missed in one prefill. That is the
catch-up scheduling/gate.py, sim/drive.py (`catch_up_ms`) and tune/prefill.py price.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from avkit.drafters.base import Drafter, DraftInput, DraftProposal
from avkit.features import LOGIT_FEATURES
from avkit.kernels.dispatch import Kernels, select_kernels
from avkit.kernels.rng import argmax
from avkit.models.transformer import HostLengths
from avkit.runtime.prefill import prefill
from avkit.runtime.sampling import probs_from_logits, sample_tokens
from avkit.scheduling.cost import FREE_LAG  # rows lacking more tokens than this are prefilled first
from avkit.step_types import DraftBatch


class DraftModelDrafter(Drafter):
    """Host bookkeeping: the drafter keeps its cache lengths per slot on the host (`_have`), knows
    which rows draft in each pass from the engine's host counts, and so feeds the model with
    `HostLengths`: a draft pass reads nothing back from the device, except the policy's early-stop
    mask (one [B] bool copy per pass, only when the policy stops drafting early)."""

    kind = "model"

    def __init__(self, draft, max_batch: int, max_len: int, kernels: Kernels | None = None):
        self.model = draft.model
        self.cache = self.model.new_cache(max_batch, max_len)
        self.device = self.cache.lengths.device
        self.kernels = kernels if kernels is not None else select_kernels(self.device, "torch")
        self.forward_s = 0.0  # wall time inside model forwards (for the engine's overhead stats)
        self._have = [0] * max_batch  # host mirror of cache.lengths

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def lag(self, slot: int, length: int) -> int:
        """Tokens of the length-`length` sequence in `slot` that the cache lacks (host count)."""
        return length - self._have[slot]

    def _forward(self, tokens, q_lens, slots, logits, host: HostLengths | None = None, prefill: bool = False):
        t0 = time.perf_counter()
        out = self.model.forward(tokens, q_lens, slots, self.cache, logits=logits, host=host, prefill=prefill)
        self.forward_s += time.perf_counter() - t0
        return out

    def _catch_up(self, inp: DraftInput, slots: list[int], rows: list[int]) -> tuple[list[list[int]], list[int]]:
        """Prefill the rows of `rows` (those drafting) that lag far behind (new prompts, rows that did not
        draft for a while) up to all but their last token; -> per row of `rows` the tokens the first pass
        feeds (1 or 2) and the cached lengths before it. Rows not drafting are left behind (lazy)."""
        lag = [b for b in rows if len(inp.sequences[b]) - self._have[slots[b]] > FREE_LAG]
        prefill(self._forward, [inp.sequences[b][self._have[slots[b]]:-1] for b in lag], [slots[b] for b in lag],
                device=self.device, ragged=getattr(self.model, "ragged_prefill", False))
        for b in lag:
            self._have[slots[b]] = len(inp.sequences[b]) - 1
        return [inp.sequences[b][self._have[slots[b]]:] for b in rows], [self._have[slots[b]] for b in rows]

    @torch.inference_mode()
    def propose(self, inp: DraftInput) -> DraftProposal:
        B, K, dev = len(inp.sequences), inp.k, self.device
        out = DraftProposal.empty(inp, self.vocab_size, self.kind, LOGIT_FEATURES, dev)  # [B, K] buffers
        confs = torch.zeros(B, K, device=dev)  # [B, K] the estimator's predictions (kernel), 0 past drafted
        feats, drafted = out.features, out.num_drafted  # name -> [B, K]; [B] drafts proposed so far
        slots, wanted = (list(inp.host_slots()), list(inp.host_num_draft())) if K else ([], [])  # host bookkeeping
        rows = [b for b in range(B) if wanted[b] > 0]  # rows drafting in this pass
        self.passes = 0
        confidences = confs if K and inp.coefficients is not None else None
        if not rows:  # nothing drafts (K = 0, the gate off): the drafter is not run at all
            return replace(out, confidences=confidences)
        self.draft_rows = len(rows)
        feed, cached = self._catch_up(inp, slots, rows)
        width = max((len(f) for f in feed), default=1)
        tokens = torch.tensor([f + [0] * (width - len(f)) for f in feed], dtype=torch.int64).to(dev)  # [b, <=2]
        host = HostLengths(tuple(slots[b] for b in rows), tuple(cached), tuple(len(f) for f in feed))
        coef = inp.coefficients if inp.coefficients is not None else (torch.zeros(1), torch.zeros(K))
        done = {}  # row -> drafts proposed
        for i in range(K):
            if not rows:
                break
            idx = torch.tensor(rows, dtype=torch.int64).to(dev)  # [b] a host-to-device copy
            logits = self._forward(tokens, torch.tensor(host.q_lens).to(dev), inp.slots[idx], "last", host)  # [b, V]
            temp, top_p = inp.temperature[idx], inp.top_p[idx]
            # One pass over the logits (the confidence kernel): the lossless features and, from the
            # estimator's coefficients, the predicted acceptance c = sigma(slope * logit(q_max) + beta_i).
            c = self.kernels.confidence(logits, temp, i, *coef, check=False)
            for name, value in c.features().items():
                feats[name][idx, i] = value
            confs[idx, i] = c.confidence
            if inp.greedy:  # every row T = 0: q is one-hot at the argmax (the verify reads only the token)
                x = argmax(logits)  # [b]
                out.q_sampled[idx, i] = 1.0
            else:
                q = probs_from_logits(logits, temp, top_p, greedy=inp.greedy, nucleus=inp.nucleus)  # [b, V] x_i ~ q
                x = sample_tokens(q, inp.seeds[idx], inp.request_keys[idx], inp.positions[idx] + i)
                out.probs[idx, i] = q
                out.q_sampled[idx, i] = q.gather(-1, x[:, None]).squeeze(-1)
            out.tokens[idx, i] = x
            drafted[idx] = i + 1
            for b in rows:
                done[b] = i + 1
            keep = [wanted[b] > i + 1 for b in rows]  # rows that want another draft
            if inp.continue_drafting is not None and i + 1 < K and any(keep):  # while a row may go on
                so_far = DraftBatch({n: f[:, : i + 1] for n, f in feats.items()}, drafted.clone(),
                                    confs[:, : i + 1] if inp.coefficients is not None else None)
                more = inp.continue_drafting(so_far)  # [B] the policy's lossless early stop, or None
                if more is not None:
                    more = more.tolist()  # host read: the early stop's mask, once per pass
                    keep = [k and more[b] for k, b in zip(keep, rows)]
            sel = [j for j, k in enumerate(keep) if k]
            host = HostLengths(tuple(host.slots[j] for j in sel),
                               tuple(host.cached[j] + host.q_lens[j] for j in sel), (1,) * len(sel))
            rows = [rows[j] for j in sel]
            tokens = x[torch.tensor(sel, dtype=torch.int64).to(dev), None]  # [b', 1]
        self.passes = max(done.values(), default=0)
        for b, n in done.items():  # the cache now holds the sequence and x_1..x_{n-1}
            self._have[slots[b]] = len(inp.sequences[b]) + n - 1
        return replace(out, confidences=confidences)

    def commit(self, slots: torch.Tensor, num_valid: torch.Tensor,
               host: tuple[list[int], list[int]] | None = None) -> None:
        ids, valid = host if host is not None else (slots.tolist(), num_valid.tolist())  # read only without host
        for s, v in zip(ids, valid):
            self._have[s] = min(self._have[s], v)
        self.cache.truncate(slots, num_valid)

    def release(self, slot: int) -> None:
        self.cache.free(slot)
        self._have[slot] = 0


__all__ = ["DraftModelDrafter"]
