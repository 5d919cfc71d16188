"""Live Hybrid Verified Decoding (docs/hvd.md): per request and step, verify the suffix-cache draft or run the
draft model. Routers: a mean-head payoff model thresholded at tau, ArcticInference's rule, every cache draft, or
(a survival-head payoff model) the joint router of `joint.py`, whose rows propose exactly their planned prefix
(`plans` is then True: the engine verifies what was proposed, no second plan).

Glossary:
  slot state   per engine slot: the suffix cache request and its `RequestFeatures`, fed token by token with
               the cache draft made before each, as the replay feeds it (live features = replay features)
  model hits   the draft model's token at t was the target's, learned from its own verified proposals;
               positions it never proposed count as hits, as in `avkit.hvd.replay`
  cache rows   deterministic drafts, one-hot draws (rejection sampling accepts with p(x): lossless); their
               lossless features come from the two-point distribution (P_j / P_{j-1}, rest) of the trie's
               path probabilities, and `cache_rows` has the policy score them with the cache's own estimator
Routing reads only the context and the cache draft, never the target's draws (docs/lossless.md). Tensors are
made on the device of the step's inputs; the host holds the tries and the routing decision.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from avkit.config import HvdReplayConfig, SuffixCacheConfig
from avkit.drafters.base import Drafter, DraftInput, DraftProposal
from avkit.errors import ConfigError
from avkit.features import draft_features
from avkit.hvd.features import FEATURE_GROUPS, RequestFeatures, class_table_for, columns
from avkit.hvd.joint import JointRouter
from avkit.hvd.payoff_mlp import PayoffMLP
from avkit.hvd.router import MLPRouter, RouterContext, make_router
from avkit.hvd.suffix_cache import CacheDraft, SuffixCache, common_prefix


@dataclass
class _Slot:
    rid: str
    feats: RequestFeatures  # prompt + output appended to the cache so far, drafts, model hits
    pending: tuple[int, list[int]] | None = None  # (output position, tokens) of the last model draft


def _fill_cache_rows(rows: np.ndarray, drafts: list[CacheDraft], limit: np.ndarray, prop: DraftProposal) -> None:
    """Write the cache rows ([Bc] of them, each draft's first `limit` [Bc] tokens) into `prop` at once: one-hot
    draws (into `probs` rows that are still zero; none when `probs` has width 0), the two-point features of
    each step's frequency probability, match length and score."""
    tokens, probs, feats, extra = prop.tokens, prop.probs, prop.features, prop.extra
    K, dev = tokens.shape[1], tokens.device
    n = np.minimum([d.draft_len for d in drafts], np.minimum(limit, K))  # [Bc]
    pad_tok = np.zeros((len(drafts), K), dtype=np.int64)  # [Bc, K]
    path = np.ones((len(drafts), K + 1))  # [Bc, K+1] P_0 = 1, P_j (held past the draft's end)
    for i, d in enumerate(drafts):
        pad_tok[i, : n[i]] = d.tokens[: n[i]]
        path[i, 1: n[i] + 1] = d.probs[: n[i]]
    r = torch.as_tensor(rows, device=dev)  # [Bc]
    valid = torch.as_tensor(np.arange(K)[None, :] < n[:, None], device=dev)  # [Bc, K]
    tok = torch.as_tensor(pad_tok, device=dev)  # [Bc, K]
    tokens[r] = tok
    if probs.shape[2]:  # deterministic draft: one-hot at each drafted token (width 0: a greedy batch)
        probs[r[:, None], torch.arange(K, device=dev)[None, :], tok] = valid.float()  # [Bc, K] entries
    prop.q_sampled[r] = valid.float()
    prop.num_drafted[r] = torch.as_tensor(n, device=dev)
    p = torch.as_tensor(path, dtype=torch.float32, device=dev)  # [Bc, K+1]
    cond = (p[:, 1:] / p[:, :-1]).clamp(1e-6, 1 - 1e-6)  # [Bc, K] per-step frequency probability
    two_point = torch.stack([cond.log(), (1 - cond).log()], -1)  # [Bc, K, 2] logits
    nan = torch.tensor(float("nan"), device=dev)
    for name, v in draft_features(two_point).items():  # v [Bc, K]
        feats.setdefault(name, torch.full(tokens.shape, float("nan"), device=dev))[r] = torch.where(valid, v, nan)
    for name, col in (("match_len", [d.match_len for d in drafts]), ("cache_score", [d.score for d in drafts])):
        val = torch.as_tensor(col, dtype=torch.float32, device=dev)[:, None].expand(-1, K)  # [Bc, K]
        extra[name][r] = torch.where(valid, val, nan)


class HybridDrafter(Drafter):
    kind = "hybrid"

    def __init__(self, model_drafter, payoff: PayoffMLP | None, tau: float,
                 cache_config: SuffixCacheConfig = SuffixCacheConfig(), classes: np.ndarray | None = None,
                 history_window: int = HvdReplayConfig.history_window, k: int = HvdReplayConfig.k,
                 vocab_size: int | None = None, rule: str = "arctic", joint: JointRouter | None = None, cache: SuffixCache | None = None):
        """Routed by `joint`, else `payoff` thresholded at `tau`, else `rule` (ArcticInference's score >= K, or
        every cache draft: the replay's routers). `cache`: a suffix cache shared beyond this drafter (the
        server's, kept across engine restarts; an earlier drafter's live requests are dropped)."""
        payoff = joint.payoff if joint is not None else payoff
        if set(FEATURE_GROUPS["structure"]) & set(payoff.feature_names if payoff else ()) and classes is None:
            raise ConfigError("hybrid drafter: the payoff model uses token-structure features; pass `classes`")
        if rule not in ("arctic", "cache"):
            raise ConfigError(f"hybrid drafter: rule must be 'arctic' or 'cache', got {rule!r}")
        self.vocab_size = vocab_size or getattr(model_drafter, "vocab_size", None)
        if self.vocab_size is None:
            raise ConfigError("hybrid drafter: vocab_size is needed when there is no model drafter")
        if cache is not None:
            cache.abandon_live()
        self.cache = cache if cache is not None else SuffixCache(cache_config)
        self.model_drafter, self.payoff, self.tau, self.joint = model_drafter, payoff, tau, joint
        self.classes, self.window, self.k = classes, history_window, payoff.k if payoff is not None else k
        self.router = MLPRouter(model=payoff, tau=tau) if payoff is not None else make_router(rule)
        self.ctx = RouterContext(self.k, features=payoff.feature_names if payoff is not None else ())
        self.plans = joint is not None  # the engine's policy does not plan again (engine.step)
        self._history = payoff is not None  # a payoff model reads the history and copy features
        self._slots: dict[int, _Slot] = {}
        self._slot_ids: list[int] = []  # this step's slots, row by row (read once in `features`)
        self._n = 0

    @classmethod
    def from_file(cls, model_drafter, path, tokenizer: str | None = None, **kwargs) -> HybridDrafter:
        """`avkit hvd`'s payoff_mlp.pt: threshold routing at its tau; payoff_survival.pt: joint routing with one
        verification budget; no `path`: ArcticInference's rule. `tokenizer` (model path or alias) supplies token
        classes when the payoff model uses structure features."""
        if not path:
            return cls(model_drafter, None, 0.0, **kwargs)
        payoff, extra = PayoffMLP.load(path)
        if tokenizer and set(FEATURE_GROUPS["structure"]) & set(payoff.feature_names):
            kwargs["classes"] = class_table_for(tokenizer)  # without: __init__ names the problem
        if payoff.head == "survival":
            return cls(model_drafter, None, 0.0, joint=JointRouter.from_extra(payoff, extra, str(path)), **kwargs)
        return cls(model_drafter, payoff, float(extra.get("tau", 0.0)), **kwargs)

    @property
    def forward_s(self) -> float:
        return getattr(self.model_drafter, "forward_s", 0.0)

    def _sync(self, slot: int, seq: list[int]) -> _Slot:
        """Append tokens the cache lacks one at a time, drafting before each (the replay's loop)."""
        st = self._slots.get(slot)
        if st is None:
            self._n += 1
            st = self._slots[slot] = _Slot(f"s{slot}.{self._n}",
                                           RequestFeatures(seq, self.k, self.window, self.classes))
            self.cache.start_request(st.rid, seq)
            return st
        f = st.feats
        for tok in seq[len(f.seq):]:  # the draft made before each token feeds the history features only
            f.append(tok, self.cache.draft(st.rid, self.k).tokens if self._history else [])
            self.cache.append(st.rid, [tok])
        if st.pending is not None:  # learn the model's hits from its last proposal, now verified
            t0, toks = st.pending
            st.pending = None
            truth = f.seq[f.prompt_len + t0: f.prompt_len + t0 + len(toks)]
            n = common_prefix(toks, truth)
            if n < min(len(toks), len(truth)):
                f.hits[t0 + n] = False
        return st

    def features(self, inp: DraftInput, payoff: bool = True) -> tuple[list[CacheDraft], dict[str, np.ndarray]]:
        """Bring each row's cache up to date; its cache draft and payoff features ([B] per name). Without
        `payoff` (a rule routes) only the cache's own numbers: the history and copy features go unread."""
        drafts, rows = [], []
        self._slot_ids = inp.slots.tolist()  # the step's one host read of slots and draft counts
        self._wanted = np.asarray(inp.num_draft.tolist(), dtype=np.int64)  # [B]
        for b, (slot, wanted) in enumerate(zip(self._slot_ids, self._wanted.tolist())):
            st = self._sync(slot, inp.sequences[b])
            drafts.append(d := self.cache.draft(st.rid, min(self.k, wanted)))
            rows.append(st.feats.row(d) if payoff else {"score": d.score, "draft_len": d.draft_len})
        return drafts, columns(rows)

    def route(self, inp: DraftInput) -> tuple[list[CacheDraft], np.ndarray, np.ndarray]:
        """Cache drafts for every row, whether to use them ([B] bool) and each row's limit ([B] int64)."""
        drafts, cols = self.features(inp, payoff=self._history)
        if self.joint is not None and drafts:
            md = self.model_drafter
            lag = None if md is None else np.array([md.lag(s, len(q)) for s, q in zip(self._slot_ids, inp.sequences)])
            use, limit = self.joint.decide(cols, self._wanted, lag)
            return drafts, use, limit
        use = self.router.route(cols, self.ctx).use_cache if drafts else np.zeros(0, dtype=bool)  # [B]
        return drafts, use, np.where(use, [d.draft_len for d in drafts], self._wanted).astype(np.int64)

    def propose(self, inp: DraftInput) -> DraftProposal:
        B, dev = len(inp.sequences), inp.num_draft.device
        drafts, use, limit = self.route(inp)  # host: the tries and the router ([B] bool, [B] int64)
        K = inp.k if (limit > 0).any() else 0  # else a target-only step (the plan verifies nothing): no slots
        model, cache = ~use & (limit > 0), use & (limit > 0)  # [B] rows each drafter drafts for
        self.lookups, self.passes, self.draft_rows = B, 0, 0  # the step's shape for the cost model
        if self.model_drafter is not None and model.any():  # the model drafts its rows' limits, skips the rest
            want = np.where(model, limit, 0)  # [B] (joint: the planned prefix)
            prop = self.model_drafter.propose(replace(
                inp, num_draft=torch.as_tensor(want, device=dev), num_draft_ids=tuple(want.tolist()), max_draft=K,
                continue_drafting=None, coefficients=None))
            self.passes, self.draft_rows = self.model_drafter.passes, self.model_drafter.draft_rows
            rows = torch.as_tensor(np.flatnonzero(model), device=dev)  # [Bm]
            toks, nums = prop.tokens[rows].tolist(), prop.num_drafted[rows].tolist()  # one device -> host copy
            for b, t, n in zip(np.flatnonzero(model).tolist(), toks, nums):  # its hits are learned next step
                st = self._slots[self._slot_ids[b]]
                st.pending = (len(st.feats.drafts), t[:n])
        else:
            prop = DraftProposal.empty(replace(inp, max_draft=K), self.vocab_size, "model", (), dev)
        prop = replace(prop, kind=["suffix" if u else "model" for u in use],
                       extra={n: torch.full((B, K), float("nan"), device=dev) for n in ("match_len", "cache_score")},
                       cache_rows=torch.as_tensor(cache, device=dev))
        if cache.any():
            rows = np.flatnonzero(cache)
            _fill_cache_rows(rows, [drafts[b] for b in rows], limit[rows], prop)
        # The policy scores the cache rows with the cache's own estimator (scheduling/adaptive.py): the trie's
        # frequencies are not the draft model's probabilities, so they get their own coefficients.
        return prop

    def commit(self, slots: torch.Tensor, num_valid: torch.Tensor, host=None) -> None:
        if self.model_drafter is not None:
            self.model_drafter.commit(slots, num_valid, host)

    def observe_final(self, slot: int, sequence: list[int]) -> None:
        """The request's final tokens (its last step's are not synced otherwise): cached whole on release."""
        if slot in self._slots:
            self._sync(slot, sequence)

    def release(self, slot: int) -> None:
        st = self._slots.pop(slot, None)
        if st is not None:
            self.cache.finish_request(st.rid)
        if self.model_drafter is not None:
            self.model_drafter.release(slot)


__all__ = ["HybridDrafter"]
