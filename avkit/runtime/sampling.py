"""From logits to the distribution a token is sampled from: temperature, then top-k and min-p
(optional, per request), then top-p (nucleus).

Glossary:
  T        temperature; T = 0 is greedy and gives a one-hot distribution at the argmax, so greedy
           requests run through the same probabilistic verification as sampled ones (accept iff
           x = argmax p, recover argmax p) and can share a batch with them
  top_p    keep the most probable tokens until their mass reaches top_p; the token that crosses
           the threshold is kept, and so is every token tied with it (the rule depends on values
           only, never on sort order)
  top_k    keep the k most probable tokens (and every token tied with the k-th), renormalise
  min_p    keep tokens whose probability is >= min_p times the largest one, renormalise
           (top-k and min-p are both value thresholds on softmax(logits / T): they commute; top-p
           then applies to what they kept, as vLLM orders them)
Target and draft distributions are truncated by temperature and top-p alike; top-k and min-p are
applied to the target's distribution only (the engine verifies against it). Rejection sampling
emits the verifier's distribution whatever the draft proposes, so speculative decoding stays
lossless with respect to the target's own temperature + top-k + min-p + top-p sampling; drafts
outside the kept set are simply rejected.
"""

from __future__ import annotations

import torch

from avkit.kernels.rng import argmax, uniform
from avkit.models import native

STREAM_DRAFT = 2  # rng stream of draft-token sampling (kernels/rejection_ref.py uses STREAM_ACCEPT and STREAM_SAMPLE)
_TOPK_LADDER = (64, 1024, 8192)  # nucleus search: the top 64, 1024, 8192, then the whole vocabulary


def top_p_threshold(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Smallest kept probability per row of ``probs`` [N, V] for nucleus ``top_p`` [N] -> [N] (0: keep all).

    A full sort of a 150k vocabulary costs ~10-40 ms per row on CPU while the nucleus of an LM is
    almost always inside its top 64 or 1024 tokens, so sort only as far as needed: every row's top 64
    first (fixed shape), then ONE host read asks whether any nucleus is longer; only those rows go on
    to the next rungs of the ladder (rare: further reads).
    """
    n, v = probs.shape
    rungs = [k for k in _TOPK_LADDER if k < v] + [v]
    pending = top_p < 1.0  # [N] rows whose nucleus is not found yet
    thresh = torch.zeros(n, dtype=probs.dtype, device=probs.device)
    thresh, pending = _rung(probs, top_p, rungs[0], v, thresh, pending)
    if len(rungs) == 1 or not bool(pending.any()):  # host read: the nucleus search's one
        return thresh
    todo = torch.nonzero(pending).squeeze(-1)
    for k in rungs[1:]:
        if todo.numel() == 0:
            break
        sub, still = _rung(probs[todo], top_p[todo], k, v, thresh[todo], torch.ones_like(todo, dtype=torch.bool))
        thresh[todo] = sub
        todo = todo[still]
    return thresh


def _rung(probs, top_p, k: int, v: int, thresh, pending):
    """One rung on every row of `probs` [N, V]: rows whose nucleus ends inside their top k get its
    smallest probability; -> (thresh [N], still pending [N])."""
    vals = probs.topk(k, dim=-1).values  # [N, k] descending
    before = vals.cumsum(-1) - vals  # mass ranked strictly before each token
    keep = before < top_p[:, None]  # [N, k]: a prefix
    done = (~keep[:, -1]) | (k == v)  # the nucleus ends inside these k
    last = keep.sum(-1).clamp(min=1) - 1
    found = vals.gather(-1, last[:, None]).squeeze(-1)  # [N]
    return torch.where(pending & done, found, thresh), pending & ~done


def top_k_min_p(probs: torch.Tensor, top_k: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Zero what top-k and min-p drop from ``probs`` [N, V] and renormalise -> [N, V].

    ``top_k`` [N] int (0 = off), ``min_p`` [N] float (0 = off). A token survives iff its probability is
    >= the k-th largest (ties kept) and >= min_p * the largest: both are thresholds on values.
    """
    v = probs.shape[-1]
    k = top_k.clamp(0, v)  # [N]
    thresh = probs.max(-1).values * min_p  # [N]
    if bool((k > 0).any()):  # host reads (only when a request sets top-k/min-p): any top-k, the widest
        kth = probs.topk(int(k.max()), dim=-1).values.gather(-1, (k.clamp(min=1) - 1)[:, None]).squeeze(-1)  # [N]
        thresh = torch.where(k > 0, torch.maximum(thresh, kth), thresh)
    probs = probs.masked_fill(probs < thresh[:, None], 0.0)
    return probs / probs.sum(-1, keepdim=True)


def _sampled_probs(logits: torch.Tensor, t: torch.Tensor, tp: torch.Tensor, tk: torch.Tensor | None = None,
                   mp: torch.Tensor | None = None, nucleus: bool | None = None) -> torch.Tensor:
    """softmax(logits / T), then top-k / min-p when given, then the top-p nucleus, renormalised; [N, V].
    Rows with top_p >= 1 are left as they are; nucleus=False (host: no row truncates) skips the search.
    On the CPU backend the same maths in a few passes per row (models/native.py), logits bf16 or float32."""
    if tk is None and native.sampling_usable(logits):
        return native.sampled_probs(logits, t, tp)
    probs = torch.softmax(logits.float() / t[:, None], dim=-1)  # [N, V]
    if tk is not None:
        probs = top_k_min_p(probs, tk, mp)
    if nucleus is False:
        return probs
    # In place: rows with top_p >= 1 have threshold 0 (nothing cut) and are divided by exactly 1 (unchanged).
    cut = probs.masked_fill_(probs < top_p_threshold(probs, tp)[:, None], 0.0)  # [N, V]
    return cut.div_(torch.where(tp < 1.0, cut.sum(-1), 1.0)[:, None])


def _one_hot(flat: torch.Tensor) -> torch.Tensor:
    """[N, V] -> [N, V] float32, 1 at each row's argmax."""
    return torch.zeros(flat.shape, dtype=torch.float32, device=flat.device).scatter_(-1, argmax(flat)[:, None], 1.0)


def probs_from_logits(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                      top_k: torch.Tensor | None = None, min_p: torch.Tensor | None = None, *,
                      greedy: bool | None = None, nucleus: bool | None = None) -> torch.Tensor:
    """Sampling distribution of ``logits`` [..., V] -> [..., V] float32.

    ``temperature``, ``top_p`` and the optional ``top_k`` / ``min_p`` (both or neither) broadcast to
    ``logits.shape[:-1]`` (e.g. [B, 1] for [B, S, V]). T = 0 rows are one-hot at the argmax (top-k and
    min-p always keep the argmax). Fixed shapes, no host read: greedy and sampled rows are both computed
    and selected per row. Host hints from the caller's bookkeeping skip work: greedy=True (every row
    has T = 0: no softmax at all), greedy=False (no row has T = 0: no one-hot), nucleus=False (no row
    has top_p < 1: no nucleus search, whose first rung otherwise costs one host read).
    """
    lead, v = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, v)  # [N, V] (float32 copies only where the torch maths needs them)
    t = temperature.float().expand(lead).reshape(-1)  # [N]
    if greedy:
        return _one_hot(flat).reshape(*lead, v)  # [N, V]
    tp = top_p.float().expand(lead).reshape(-1)  # [N]
    tk = top_k.expand(lead).reshape(-1) if top_k is not None else None  # [N]
    mp = min_p.float().expand(lead).reshape(-1) if top_k is not None else None  # [N]
    if greedy is False:  # no T = 0 row: no one-hot to build and select
        return _sampled_probs(flat, t, tp, tk, mp, nucleus).reshape(*lead, v)
    is_greedy = t == 0  # [N]
    one_hot = _one_hot(flat)  # [N, V]
    sampled = _sampled_probs(flat, torch.where(is_greedy, 1.0, t), torch.where(is_greedy, 1.0, tp), tk, mp, nucleus)
    return torch.where(is_greedy[:, None], one_hot, sampled).reshape(*lead, v)


def sample_tokens(probs: torch.Tensor, seeds: torch.Tensor, request_keys: torch.Tensor,
                  positions: torch.Tensor) -> torch.Tensor:
    """Draw one token per row of ``probs`` [B, V] by inverse CDF with one keyed uniform -> [B] int64.

    u = uniform(seed, request, position, STREAM_DRAFT, 0); token = first v with cumsum(p)_v > u * sum(p).
    A zero-probability token can never be chosen (its cumsum equals its predecessor's).
    """
    u = uniform(seeds, request_keys, positions, STREAM_DRAFT, 0)  # [B]
    cdf = probs.float().cumsum(-1)  # [B, V]
    target = (u * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
