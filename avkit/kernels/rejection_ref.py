"""Rejection sampling for speculative decoding with a variable number of verified drafts per request.

Speculative sampling (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023, arXiv 2302.01318).
Glossary:
  x_j          draft token at slot j (0-based), drawn from the draft distribution q_j
  p_j          target distribution at slot j (p_{k} is the bonus distribution after k drafts)
  num_verify   k_r: request r's drafts x_0..x_{k_r-1} are verified; the rest are censored
  accepted     x_j kept: all of x_0..x_{j-1} kept and u_j < p_j(x_j) / q_j(x_j)
  num_accepted n_r: length of the accepted prefix (<= k_r)
  recovered    at the first rejection n < k: a token from norm(max(0, p_n - q_n))
  bonus        when all k verified drafts are accepted: a token from p_k
  observed     verified and at or before the first rejection: the slot carries a label
A step emits x_0..x_{n-1} and one recovered or bonus token, distributed exactly as the target for any k_r
chosen without looking at the draws: whether slot j is verified may depend on q_0..q_j but not on x_j or later
draws (trimming on q_j(x_j) breaks it, tests/test_lossless.py, and so, subtly, does verifying slot 0 by q_1's
shape, a function of the drawn x_0). Random numbers come from `avkit.kernels.rng.uniform`, so the Triton kernel
(`avkit.kernels.rejection`) reproduces this bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from avkit.errors import DataError
from avkit.kernels.rng import STREAM_ACCEPT, STREAM_SAMPLE, argmax, uniform
from avkit.trace import labels as label_rule


@dataclass(frozen=True)
class RejectionResult:
    output_tokens: torch.Tensor  # [B, K+1] int64: accepted drafts, then the recovered/bonus token, -1 padded
    num_accepted: torch.Tensor  # [B] int64: accepted prefix length n_r (the step emits n_r + 1 tokens)
    accepted: torch.Tensor  # [B, K] bool: slot accepted (False when rejected, censored or unverified)
    observed: torch.Tensor  # [B, K] bool: verified and at or before the first rejection (has a label)
    target_prob: torch.Tensor  # [B, K] float32: p_j(x_j) for verified slots, NaN elsewhere


def rejection_inputs(target_probs, draft_probs, draft_tokens, num_verify, seeds, request_keys, positions, greedy=False):
    """Both paths' shape checks (no value checks: they would read the device)."""
    B, K = draft_tokens.shape
    V = target_probs.shape[-1]
    q_ok = tuple(draft_probs.shape) in ({(B, K, V), (B, K, 0)} if greedy else {(B, K, V)})
    if tuple(target_probs.shape) != (B, K + 1, V) or not q_ok:
        raise DataError(f"rejection_sample: target_probs {tuple(target_probs.shape)} and draft_probs "
                        f"{tuple(draft_probs.shape)} must be [B, K+1, V] and [B, K, V] (greedy: or [B, K, 0]) "
                        f"with draft_tokens [B, K] = {(B, K)}")
    for name, t in (("num_verify", num_verify), ("seeds", seeds), ("request_keys", request_keys),
                    ("positions", positions)):
        if tuple(t.shape) != (B,):
            raise DataError(f"rejection_sample: {name} must have shape [{B}], got {tuple(t.shape)}")


def exponential_race(weights: torch.Tensor, seeds: torch.Tensor, request_keys: torch.Tensor,
                     positions: torch.Tensor, stream: int = STREAM_SAMPLE) -> torch.Tensor:
    """[B] int64: one index per row with probability proportional to ``weights`` [B, V] (>= 0).

    argmax_v w_v / E_v with E_v = -log(u_v) ~ Exp(1) picks v with probability w_v / sum w (the exponential
    race). Only nonzero weights draw a number, so sparse (top-p, one-hot) rows cost only their support.
    """
    rows, cols = weights.nonzero(as_tuple=True)  # [N] each: the support
    u = uniform(seeds[rows], request_keys[rows], positions[rows], stream, cols)  # [N]
    score = torch.zeros_like(weights, dtype=torch.float32)  # [B, V]
    score[rows, cols] = weights[rows, cols].float() / -torch.log(u)
    return argmax(score)


def rejection_sample_ref(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                         num_verify: torch.Tensor, *, greedy: bool, seeds: torch.Tensor,
                         request_keys: torch.Tensor, positions: torch.Tensor) -> RejectionResult:
    """Verify drafts against the target: the torch reference (the specification and the CPU path).

    Parameters
    ----------
    target_probs : [B, K+1, V] float, the target distribution at each slot (rows beyond k_r unused);
        greedy: any scores whose argmax is the target's token (the logits), and target_prob reports the
        one-hot distribution's p(x_j): 1 where x_j is that argmax, else 0
    draft_probs : [B, K, V] float, the (truncated) distribution each draft token was drawn from
        (greedy: unread, and may be [B, K, 0])
    draft_tokens : [B, K] int64 (entries beyond num_drafted may hold any valid id)
    num_verify : [B] int64 in [0, K]
    greedy : accept iff x_j = argmax p_j and emit argmax tokens (no random numbers)
    seeds, request_keys : [B] int64 random-number keys of each request
    positions : [B] int64, absolute sequence position of draft slot 0

    Examples
    --------
    >>> p = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]]); q = torch.tensor([[[0.0, 1.0]]])
    >>> z = torch.zeros(1, dtype=torch.int64)
    >>> r = rejection_sample_ref(p, q, torch.tensor([[1]]), torch.tensor([1]), greedy=False,
    ...                          seeds=z, request_keys=z, positions=z)
    >>> r.output_tokens.tolist(), r.num_accepted.tolist()
    ([[1, 0]], [1])
    """
    rejection_inputs(target_probs, draft_probs, draft_tokens, num_verify, seeds, request_keys, positions, greedy)
    B, K = draft_tokens.shape
    rows = torch.arange(B, device=draft_tokens.device)
    j = torch.arange(K, device=draft_tokens.device)  # [K]
    verified = j[None, :] < num_verify[:, None]  # [B, K]
    if greedy:  # T = 0: p_j is one-hot at the argmax, so p_j(x_j) = 1[x_j = argmax]
        ok = draft_tokens == argmax(target_probs[:, :K])  # [B, K]
        p_x = ok.float()
    else:
        p_x = target_probs[:, :K].gather(-1, draft_tokens[..., None]).squeeze(-1).float()  # [B, K]
        q_x = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1).float()  # [B, K]
        u = uniform(seeds[:, None], request_keys[:, None], positions[:, None] + j, STREAM_ACCEPT, 0)
        # Accept x_j with probability min(1, p/q): u < p/q. A drawn token has q > 0.
        ok = u < p_x / q_x.clamp_min(torch.finfo(torch.float32).tiny)
    accepted = (ok & verified).long().cumprod(-1).bool()  # [B, K]: prefix up to the first rejection
    n = accepted.sum(-1)  # [B]
    observed = label_rule.observed(j[None, :], num_verify[:, None], n[:, None])  # [B, K]

    p_n = target_probs[rows, n].float()  # [B, V]: target distribution at the first unaccepted slot
    if greedy:
        token = argmax(p_n)
    else:
        # Rejected at slot n < k: recover from norm(max(0, p_n - q_n)); all k accepted: bonus from p_k.
        rejected = n < num_verify  # [B]
        if K > 0:
            q_n = draft_probs[rows, n.clamp(max=K - 1)].float()  # [B, V]
            residual = torch.where(rejected[:, None], (p_n - q_n).clamp_min(0.0), p_n)
            # p = q exactly leaves no residual mass (then no rejection can occur but for rounding).
            residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
        else:
            residual = p_n
        token = exponential_race(residual, seeds, request_keys, positions + n)

    output = torch.where(accepted, draft_tokens, -1)  # [B, K]
    output = torch.cat([output, output.new_full((B, 1), -1)], dim=1)  # [B, K+1]
    output[rows, n] = token
    target_prob = torch.where(verified, p_x, torch.full_like(p_x, float("nan")))
    return RejectionResult(output, n, accepted, observed, target_prob)


__all__ = ["RejectionResult", "exponential_race", "rejection_sample_ref"]
