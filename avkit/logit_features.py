"""Draft-distribution features computed from logits (torch only): the part of `avkit.features` that an
engine process imports (vLLM's venv has torch but not polars; see avkit/engines/vllm/).

Glossary: as in `avkit.features` (l, m, m2, s_o, q_max, logit_qmax).
"""

from __future__ import annotations

import torch

from avkit.errors import DataError

CLAMP = 40.0  # every unbounded feature is clamped to [-CLAMP, CLAMP] (float32-safe, finite)


def _as_temperature(temperature, logits: torch.Tensor) -> torch.Tensor:
    """float or tensor of a leading shape of `logits` -> [..., 1] float32, with T = 0 read as 1."""
    t = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device)
    lead = tuple(logits.shape[:-1])
    if t.dim() > len(lead) or tuple(t.shape) != lead[: t.dim()]:
        raise DataError(f"temperature shape {tuple(t.shape)} is not a leading shape of logits {lead}")
    if t.device.type == "cpu" and not bool(((t >= 0) & torch.isfinite(t)).all()):  # no GPU sync
        raise DataError(f"temperature must be finite and >= 0, got {t.flatten()[:4].tolist()}")
    t = torch.where(t == 0, torch.ones_like(t), t)
    return t.reshape(tuple(t.shape) + (1,) * (logits.dim() - t.dim()))


@torch.no_grad()
def draft_features(logits: torch.Tensor, temperature: float | torch.Tensor = 1.0) -> dict[str, torch.Tensor]:
    """Lossless features of draft distributions, from logits before top-p/top-k truncation.

    Parameters
    ----------
    logits : Tensor [..., V]
        Raw draft logits (any float dtype; -inf entries allowed). V >= 2.
    temperature : float or Tensor of a leading shape of ``logits`` (e.g. [B] for [B, K, V])
        Sampling temperature; 0 (greedy) is treated as 1.

    Returns
    -------
    dict of name -> float32 Tensor [...]: ``logit_qmax, q_max, q_2nd, entropy, log_margin,
    neg_log_neg_log_qmax``.

    Examples
    --------
    >>> f = draft_features(torch.tensor([[2.0, 0.0]]), 1.0)
    >>> round(float(f["q_max"][0]), 4), round(float(f["logit_qmax"][0]), 4)
    (0.8808, 2.0)
    """
    if logits.dim() < 1 or logits.shape[-1] < 2:
        raise DataError(f"logits must have shape [..., V] with V >= 2, got {tuple(logits.shape)}")
    l = logits.float() / _as_temperature(temperature, logits)  # [..., V]
    top, idx = l.topk(2, dim=-1)  # [..., 2]
    m, m2 = top[..., 0], top[..., 1]  # [...]
    # e_z = exp(l_z - m) with the argmax zeroed: s_o = sum e is the others' mass, computed
    # without the cancellation of (sum_all - 1), so logit_qmax = -log(s_o) stays exact as q -> 1.
    e = torch.exp(l - m.unsqueeze(-1))  # [..., V]
    e.scatter_(-1, idx[..., :1], 0.0)
    s_o = e.sum(-1)  # [...]
    z = 1.0 + s_o  # partition function in units of exp(m)
    neg_log_qmax = torch.log1p(s_o)  # -log q_max
    # H = -sum q log q = log Z - sum_z e_z (l_z - m) / Z, and e log e = e (l - m) (xlogy(0, 0) = 0).
    entropy = neg_log_qmax - torch.xlogy(e, e).sum(-1) / z
    return {
        "logit_qmax": (-torch.log(s_o)).clamp(-CLAMP, CLAMP),
        "q_max": 1.0 / z,
        "q_2nd": torch.exp(m2 - m) / z,
        "entropy": entropy.clamp_min(0.0),
        "log_margin": (m - m2).clamp(-CLAMP, CLAMP),  # m2 = -inf -> +CLAMP
        "neg_log_neg_log_qmax": (-torch.log(neg_log_qmax)).clamp(-CLAMP, CLAMP),
    }


__all__ = ["CLAMP", "draft_features"]
