"""Draft-distribution features of a draft slot, each flagged lossless or lossy (docs/lossless.md, docs/estimator.md).

A feature is lossless when it depends only on the shape of the draft distribution q (never on
which token was drawn): choosing how many drafts to verify from it keeps the output distribution
equal to the target's. Features of q(x_sampled) are lossy: better AUC, biased output.

Glossary:
  l          draft logits scaled by temperature (T = 0 treated as 1), BEFORE top-p/top-k   [..., V]
  m, m2      the largest and second largest scaled logit                                  [...]
  s_o        sum_{z != argmax} exp(l_z - m), the other tokens' mass relative to the top   [...]
  q_max      1 / (1 + s_o)
  logit_qmax log(q_max / (1 - q_max)) = m - logsumexp_{z != argmax} l_z = -log(s_o)
             (exact as q_max -> 1, where 1 - q_max rounds to 0), clamped to [-40, 40]
  q_sampled  draft probability of the drawn token under the TRUNCATED distribution it was
             drawn from (a trace column; lossy)

`draft_features` computes every logit-based feature; `FEATURES` lists every feature that `avkit
fit` scores, with its lossless flag and the polars expression that derives it from a trace (built
when asked for: the engine imports this module and never polars).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from avkit.errors import DataError

if TYPE_CHECKING:
    import polars as pl

CLAMP = 40.0  # every unbounded feature is clamped to [-CLAMP, CLAMP] (float32-safe, finite)


@dataclass(frozen=True)
class FeatureSpec:
    """One feature: its name, whether verifying by it keeps decoding lossless, and its recipe."""

    name: str
    lossless: bool
    doc: str
    recipe: Callable[[], pl.Expr]  # builds the expression that derives the feature from trace columns
    no_fit: str | None = None  # already a probability: scored by this no-fit estimator instead
    sign: float = 1.0  # multiply before fitting so that larger means more confident (slope >= 0)

    @property
    def expr(self) -> pl.Expr:
        """The polars expression (float64) deriving this feature from trace columns."""
        return self.recipe()


def _clamp(x: pl.Expr) -> pl.Expr:
    return x.clip(-CLAMP, CLAMP)


def _col(name: str) -> pl.Expr:
    import polars as pl  # lazy: polars (the engine imports this module without it)

    return pl.col(name).cast(pl.Float64)


FEATURES: dict[str, FeatureSpec] = {
    s.name: s
    for s in (
        FeatureSpec("logit_qmax", True, "log-odds of q_max from logits (the shipped feature)",
                    lambda: _col("logit_qmax")),
        FeatureSpec("log_margin", True, "log q_max - log q_2nd, the top-2 margin",
                    lambda: _clamp(_col("q_max").log() - _col("q_2nd").log())),
        FeatureSpec("entropy", True, "entropy H(q) in nats (fitted as -H)", lambda: _col("entropy"), sign=-1.0),
        # -log(-log q) with -log q = log(1 + e^{-logit}) = softplus(-logit): exact as q -> 1
        FeatureSpec("neg_log_neg_log_qmax", True, "-log(-log q_max)",
                    lambda: _clamp(-((-_col("logit_qmax")).exp().log1p()).log())),
        FeatureSpec("q_max", True, "q_max used directly as a probability (no fit)", lambda: _col("q_max"),
                    no_fit="qmax"),
        FeatureSpec("logit_q_sampled", False, "log-odds of q(x_sampled): LOSSY",
                    lambda: _clamp(_col("q_sampled").log() - (-_col("q_sampled")).log1p())),
        FeatureSpec("neg_log_neg_log_q_sampled", False, "-log(-log q(x_sampled)): LOSSY",
                    lambda: _clamp(-(-_col("q_sampled").log()).log())),
        FeatureSpec("head_conf", True, "a trained confidence head's prediction (optional trace column)",
                    lambda: _col("head_conf"), no_fit="passthrough"),
    )
}

LOGIT_FEATURES = ("logit_qmax", "q_max", "q_2nd", "entropy", "log_margin", "neg_log_neg_log_qmax")


def logits_temperature(logits: torch.Tensor, temperature, check: bool = True) -> torch.Tensor:
    """Check draft `logits` [..., V] (V >= 2) and `temperature`, a float or a tensor of a leading shape of them
    (`check`: its values too, on a CPU only) -> [..., 1] float32, with T = 0 read as 1."""
    if logits.dim() < 1 or logits.shape[-1] < 2:
        raise DataError(f"logits must have shape [..., V] with V >= 2, got {tuple(logits.shape)}")
    t = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device)
    lead = tuple(logits.shape[:-1])
    if t.dim() > len(lead) or tuple(t.shape) != lead[: t.dim()]:
        raise DataError(f"temperature shape {tuple(t.shape)} is not a leading shape of logits {lead}")
    if check and t.device.type == "cpu" and not bool(((t >= 0) & torch.isfinite(t)).all()):  # no GPU sync
        raise DataError(f"temperature must be finite and >= 0, got {t.flatten()[:4].tolist()}")
    t = torch.where(t == 0, torch.ones_like(t), t)
    return t.reshape(tuple(t.shape) + (1,) * (logits.dim() - t.dim()))


def _row_stats(logits: torch.Tensor, t: torch.Tensor):
    """(m, m2, s_o, sum_others e log e) [...] of l = logits / t: the largest and second-largest l, and with
    e_z = exp(l_z - m) over all but one argmax, s_o = sum e (the others' mass, without the cancellation of
    sum_all - 1, so logit_qmax = -log(s_o) stays exact as q -> 1) and sum e log e."""
    from avkit.models import native  # lazy: the CPU backend's C++ extension (not built for the torch path)

    lead, v = logits.shape[:-1], logits.shape[-1]
    if logits.dim() >= 2 and native.sampling_usable(logits):
        stats = native.row_stats(logits.reshape(-1, v), t.expand(*lead, 1).reshape(-1))  # [N, 4]
        return tuple(stats[:, i].reshape(lead) for i in range(4))
    l = logits.float() / t  # [..., V]
    top, idx = l.topk(2, dim=-1)  # [..., 2]
    m = top[..., 0]
    e = torch.exp(l - m.unsqueeze(-1))  # [..., V]
    e.scatter_(-1, idx[..., :1], 0.0)
    return m, top[..., 1], e.sum(-1), torch.xlogy(e, e).sum(-1)


@torch.no_grad()
def draft_features(logits: torch.Tensor, temperature: float | torch.Tensor = 1.0,
                   check: bool = True) -> dict[str, torch.Tensor]:
    """Lossless features of draft distributions, from logits before top-p/top-k truncation.

    logits [..., V] (any float dtype, -inf allowed, V >= 2); temperature: a float or a tensor of a leading shape
    of `logits` ([B] for [B, K, V]), 0 read as 1; `check` validates it (CPU only: on a GPU, a host read).
    -> name -> float32 [...]: LOGIT_FEATURES.
    """
    t = logits_temperature(logits, temperature, check)  # [..., 1]
    m, m2, s_o, s_elog = _row_stats(logits, t)  # [...] each
    z = 1.0 + s_o  # partition function in units of exp(m)
    neg_log_qmax = torch.log1p(s_o)  # -log q_max
    # H = -sum q log q = log Z - sum_z e_z (l_z - m) / Z, and e log e = e (l - m) (xlogy(0, 0) = 0).
    entropy = neg_log_qmax - s_elog / z
    return {
        "logit_qmax": (-torch.log(s_o)).clamp(-CLAMP, CLAMP),
        "q_max": 1.0 / z,
        "q_2nd": torch.exp(m2 - m) / z,
        "entropy": entropy.clamp_min(0.0),
        "log_margin": (m - m2).clamp(-CLAMP, CLAMP),  # m2 = -inf -> +CLAMP
        "neg_log_neg_log_qmax": (-torch.log(neg_log_qmax)).clamp(-CLAMP, CLAMP),
    }


__all__ = ["CLAMP", "FEATURES", "LOGIT_FEATURES", "FeatureSpec", "draft_features"]
