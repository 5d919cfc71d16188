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

`draft_features` (avkit/logit_features.py, torch only) computes every logit-based feature; `FEATURES` lists every feature that `avkit
fit` scores, with its lossless flag and the polars expression that derives it from a trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from avkit.logit_features import CLAMP, draft_features



@dataclass(frozen=True)
class FeatureSpec:
    """One feature: its name, whether verifying by it keeps decoding lossless, and its recipe."""

    name: str
    lossless: bool
    doc: str
    expr: pl.Expr  # derives the feature from trace columns (float64)
    no_fit: str | None = None  # already a probability: scored by this no-fit estimator instead
    sign: float = 1.0  # multiply before fitting so that larger means more confident (slope >= 0)


def _clamp(x: pl.Expr) -> pl.Expr:
    return x.clip(-CLAMP, CLAMP)


def _col(name: str) -> pl.Expr:
    return pl.col(name).cast(pl.Float64)


def _neg_log_neg_log_from_logit(logit: pl.Expr) -> pl.Expr:
    # -log(-log q) with -log q = log(1 + e^{-logit}) = softplus(-logit): exact as q -> 1.
    return _clamp(-((-logit).exp().log1p()).log())


FEATURES: dict[str, FeatureSpec] = {
    s.name: s
    for s in (
        FeatureSpec("logit_qmax", True, "log-odds of q_max from logits (the shipped feature)",
                    _col("logit_qmax")),
        FeatureSpec("log_margin", True, "log q_max - log q_2nd, the top-2 margin",
                    _clamp(_col("q_max").log() - _col("q_2nd").log())),
        FeatureSpec("entropy", True, "entropy H(q) in nats (fitted as -H)", _col("entropy"), sign=-1.0),
        FeatureSpec("neg_log_neg_log_qmax", True, "-log(-log q_max)",
                    _neg_log_neg_log_from_logit(_col("logit_qmax"))),
        FeatureSpec("q_max", True, "q_max used directly as a probability (no fit)", _col("q_max"),
                    no_fit="qmax"),
        FeatureSpec("logit_q_sampled", False, "log-odds of q(x_sampled): LOSSY",
                    _clamp(_col("q_sampled").log() - (-_col("q_sampled")).log1p())),
        FeatureSpec("neg_log_neg_log_q_sampled", False, "-log(-log q(x_sampled)): LOSSY",
                    _clamp(-(-_col("q_sampled").log()).log())),
        FeatureSpec("head_conf", True, "a trained confidence head's prediction (optional trace column)",
                    _col("head_conf"), no_fit="passthrough"),
    )
}

LOGIT_FEATURES = ("logit_qmax", "q_max", "q_2nd", "entropy", "log_margin", "neg_log_neg_log_qmax")


__all__ = ["CLAMP", "FEATURES", "LOGIT_FEATURES", "FeatureSpec", "draft_features"]
