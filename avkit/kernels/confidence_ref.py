"""Draft confidence, torch reference: the specification and the CPU path of `confidence_triton`.

One pass over each draft distribution gives the lossless features the policy and the trace need
and the estimator's prediction (docs/estimator.md): c = sigma(slope * logit(q_max) + intercept[position]).
Glossary:
  l       draft logits / temperature (T = 0 read as 1), before top-p/top-k     [rows, V]
  m, m2   the largest and second largest l_z (a tie for the top counts twice)  [rows]
  s_o     sum_{z != argmax} exp(l_z - m): the other tokens' mass over the top  [rows]
  q_max   1 / (1 + s_o);  q_2nd = exp(m2 - m) / (1 + s_o)
  logit   log(q_max / (1 - q_max)) = -log(s_o), exact as q_max -> 1, clamped to [-40, 40]
  H       entropy of softmax(l) = log(1 + s_o) - sum_z e_z (l_z - m) / (1 + s_o)
  margin  m - m2 = log q_max - log q_2nd;  -log(-log q_max) = -log(log1p(s_o)); both clamped
Rows are flattened draft slots (e.g. B*K); `positions` says which intercept each row uses.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from avkit.errors import DataError
from avkit.features import LOGIT_FEATURES, draft_features, logits_temperature  # one softmax pass, one clamp


class Confidence(NamedTuple):
    logit_qmax: torch.Tensor  # [...] float32
    q_max: torch.Tensor  # [...] float32
    q_2nd: torch.Tensor  # [...] float32, the second largest probability
    entropy: torch.Tensor  # [...] float32, nats
    confidence: torch.Tensor  # [...] float32, sigma(slope * logit_qmax + intercepts[positions])

    log_margin: torch.Tensor  # [...] float32, m - m2 (log q_max - log q_2nd), clamped
    neg_log_neg_log_qmax: torch.Tensor  # [...] float32, -log(-log q_max), clamped

    def features(self) -> dict[str, torch.Tensor]:
        """The lossless features of `avkit.features.draft_features` (name -> [...])."""
        return {n: getattr(self, n) for n in LOGIT_FEATURES}


def confidence_inputs(logits, temperature, positions, slope, intercepts, check: bool = True):
    """Check and flatten both paths' inputs -> logits [rows, V], 1 / temperature [rows] float32, positions [rows]
    int64, slope [1], intercepts [K] float32 (on the logits' device) and the leading shape to restore.
    check=False skips the value checks (the engine validated its requests; on a GPU each is a host read)."""
    t = logits_temperature(logits, temperature, check)  # [..., 1] (T = 0 read as 1): features.py's checks
    if not logits.dtype.is_floating_point:
        raise DataError(f"logits must be a float tensor, got {logits.dtype}")
    lead, dev = tuple(logits.shape[:-1]), logits.device
    pos = torch.as_tensor(positions, dtype=torch.int64, device=dev)
    omega = torch.as_tensor(slope, dtype=torch.float32, device=dev).reshape(1)  # [1]: may live on the device
    beta = torch.as_tensor(intercepts, dtype=torch.float32, device=dev).reshape(-1)  # [K]
    try:
        pos = torch.broadcast_to(pos, lead)
    except RuntimeError:
        raise DataError(f"positions shape {tuple(pos.shape)} does not broadcast to logits {lead}") from None
    # on a GPU this check would cost a sync per step
    if check and dev.type == "cpu" and pos.numel() and not bool(((pos >= 0) & (pos < beta.numel())).all()):
        raise DataError(f"positions must be in [0, {beta.numel()}) (one intercept each), "
                        f"got {pos.flatten()[:8].tolist()}")
    return (logits.reshape(-1, logits.shape[-1]), (1.0 / t).expand(*lead, 1).reshape(-1).contiguous(),
            pos.reshape(-1).contiguous(), omega, beta, lead)


@torch.no_grad()
def confidence_ref(logits: torch.Tensor, temperature, positions, slope, intercepts, *,
                   check: bool = True) -> Confidence:
    """Features (`avkit.features.draft_features`) and predicted acceptance of every draft slot.

    Parameters
    ----------
    logits : Tensor [..., V], float32 or bfloat16
    temperature : float or Tensor of a leading shape of ``logits`` (e.g. [B] per request); 0 is read as 1
    positions : int or int64 Tensor broadcastable to ``logits.shape[:-1]``: each row's intercept index
    slope : float or one-element Tensor (it may live on the device); intercepts : [K]
    check : validate temperature and positions (CPU only; the engine passes False)

    Returns Confidence of float32 Tensors [...] (the leading shape of ``logits``).

    Examples
    --------
    >>> c = confidence_ref(torch.tensor([[2.0, 0.0]]), 1.0, 0, 0.5, [-0.2])
    >>> round(float(c.q_max[0]), 4), round(float(c.logit_qmax[0]), 4), round(float(c.confidence[0]), 4)
    (0.8808, 2.0, 0.69)
    """
    _, _, pos, omega, beta, lead = confidence_inputs(logits, temperature, positions, slope, intercepts, check)
    f = {n: v.reshape(-1) for n, v in draft_features(logits, temperature, check=False).items()}  # [rows] each
    f["confidence"] = torch.sigmoid(omega * f["logit_qmax"] + beta[pos])
    return Confidence(**{n: f[n].reshape(lead) for n in Confidence._fields})
