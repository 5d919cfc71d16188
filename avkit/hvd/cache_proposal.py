"""Cache drafts into a draft proposal: the suffix cache's rows of HVD's hybrid drafter as tensors.

A cache draft is deterministic, so its drawn distribution is one-hot at the draft token (rejection
sampling then accepts with p(x): lossless). Its lossless features are those of the two-point
distribution (P_j / P_{j-1}, rest) of the trie's frequency probabilities P_j along the draft
(avkit.features.draft_features on two-point logits), NaN past the draft's end like a model row's.
"""

from __future__ import annotations

import numpy as np
import torch

from avkit.features import draft_features
from avkit.hvd.suffix_cache import CacheDraft


def fill_cache_rows(rows: np.ndarray, drafts: list[CacheDraft], tokens, probs, q_sampled, num,
                    feats, extra) -> None:
    """Write the cache rows ([Bc] of them) into the proposal at once: one-hot draws (into `probs` rows
    that are still zero; none when `probs` has width 0), the two-point features of each step's frequency
    probability, match length and score."""
    K, dev = tokens.shape[1], tokens.device
    n = np.array([min(d.draft_len, K) for d in drafts])  # [Bc]
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
    q_sampled[r] = valid.float()
    num[r] = torch.as_tensor(n, device=dev)
    p = torch.as_tensor(path, dtype=torch.float32, device=dev)  # [Bc, K+1]
    cond = (p[:, 1:] / p[:, :-1]).clamp(1e-6, 1 - 1e-6)  # [Bc, K] per-step frequency probability
    two_point = torch.stack([cond.log(), (1 - cond).log()], -1)  # [Bc, K, 2] logits
    nan = torch.tensor(float("nan"), device=dev)
    for name, v in draft_features(two_point).items():  # v [Bc, K]
        feats.setdefault(name, torch.full(tokens.shape, float("nan"), device=dev))[r] = torch.where(valid, v, nan)
    for name, col in (("match_len", [d.match_len for d in drafts]), ("cache_score", [d.score for d in drafts])):
        val = torch.as_tensor(col, dtype=torch.float32, device=dev)[:, None].expand(-1, K)  # [Bc, K]
        extra[name][r] = torch.where(valid, val, nan)


__all__ = ["fill_cache_rows"]
