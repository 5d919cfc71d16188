"""From logits to the distribution a token is sampled from: temperature, then top-p (nucleus).

Glossary:
  T        temperature; T = 0 is greedy and gives a one-hot distribution at the argmax, so greedy
           requests run through the same probabilistic verification as sampled ones (accept iff
           x = argmax p, recover argmax p) and can share a batch with them
  top_p    keep the most probable tokens until their mass reaches top_p; the token that crosses
           the threshold is kept, and so is every token tied with it (the rule depends on values
           only, never on sort order)
Both target and draft distributions are truncated the same way: speculative decoding is then
lossless with respect to the target's own temperature + top-p sampling.
"""

from __future__ import annotations

import torch

from avkit.kernels.rng import uniform

STREAM_DRAFT = 2  # rng stream of draft-token sampling (verify.py uses STREAM_ACCEPT and STREAM_SAMPLE)
_TOPK_LADDER = (64, 1024)  # nucleus search: try the top 64, then 1024, then the whole vocabulary


def top_p_threshold(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Smallest kept probability per row of ``probs`` [N, V] for nucleus ``top_p`` [N] -> [N].

    A full sort of a 150k vocabulary costs ~10 ms per row on CPU; the nucleus is almost always
    inside the top 64 or 1024, so sort only as far as needed (rows that need more go on to the
    next rung).
    """
    n, v = probs.shape
    thresh = torch.zeros(n, dtype=probs.dtype, device=probs.device)
    todo = torch.nonzero(top_p < 1.0).squeeze(-1)  # rows that truncate at all
    for k in _TOPK_LADDER + (v,):
        if todo.numel() == 0:
            break
        k = min(k, v)
        vals = probs[todo].topk(k, dim=-1).values  # [n_todo, k] descending
        before = vals.cumsum(-1) - vals  # mass ranked strictly before each token
        keep = before < top_p[todo, None]  # [n_todo, k]: a prefix
        done = (~keep[:, -1]) | (k == v)  # the nucleus ends inside these k
        last = keep.sum(-1).clamp(min=1) - 1
        thresh[todo[done]] = vals[done].gather(-1, last[done, None]).squeeze(-1)
        todo = todo[~done]
    return thresh


def probs_from_logits(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Sampling distribution of ``logits`` [..., V] with per-row ``temperature``, ``top_p`` [...] -> [..., V].

    T = 0 rows are one-hot at the argmax. Float32.
    """
    lead, v = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, v).float()  # [N, V]
    t = temperature.float().expand(lead).reshape(-1)  # [N]
    tp = top_p.float().expand(lead).reshape(-1)  # [N]
    greedy = t == 0
    probs = torch.softmax(flat / torch.where(greedy, 1.0, t)[:, None], dim=-1)  # [N, V]
    sampled = torch.nonzero(~greedy & (tp < 1.0)).squeeze(-1)
    if sampled.numel():
        sub = probs[sampled]
        sub = sub * (sub >= top_p_threshold(sub, tp[sampled])[:, None])
        probs[sampled] = sub / sub.sum(-1, keepdim=True)
    if bool(greedy.any()):
        hot = torch.zeros_like(probs).scatter_(-1, flat.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], hot, probs)
    return probs.reshape(*lead, v)


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


__all__ = ["STREAM_DRAFT", "probs_from_logits", "sample_tokens", "top_p_threshold"]
