"""The acceptance profile, the measured half of `avkit tune`'s document: per-position acceptance with intervals
and the fitted coefficients. Glossary, per draft position j = 0..K-1 of a group of request-steps:
  drafts         request-steps that verified at least one draft
  reached_j      request-steps that verified slot j with every slot before it accepted (slot j is labelled)
  accepted_j     request-steps whose slot j was accepted: the accepted length was > j
  conditional_j  accepted_j / reached_j: P(accept j | accepted 0..j-1); 95% Wilson score interval
  survival_j     accepted_j / drafts: P(accepted length > j), what vLLM calls the *unconditional* rate
                 (`synthetic_acceptance_rates`); non-increasing by construction; 95% Wilson interval
A trace and a vLLM Prometheus scrape give the same table: `position_table(drafts, accepted)` is the one
rule for both (`avkit import vllm-metrics`, avkit/engines/vllm/metrics.py).

The profile, key by key (`acceptance_profile`):
  pair           target, draft (ids or paths) and their sha256, drafter kind, K, engine that recorded
  groups         one per (dataset, temperature), then the pooled group (`dataset` "all", `temperature`
                 null when several): drafts, mean_accepted_length, positions [{position, reached,
                 accepted, conditional, conditional_lo, conditional_hi, survival, survival_lo, survival_hi}]
  coefficients   a coefficients.json document (avkit/estimators/coefficients.py validates it): the batch
                 maximum-likelihood fit of p = sigmoid(slope * logit_qmax + intercept_j) on every labelled
                 slot, the same model and feature as vLLM's OnlineAcceptanceEstimator (omega = slope,
                 beta_j = intercept_j); `avkit.engines.vllm.plugin` warm-starts vLLM's estimator from it
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from avkit.config import EstimatorConfig
from avkit.estimators.coefficients import coefficients_document
from avkit.estimators.online_logistic import BatchLogistic

Z95 = 1.959963984540054
FEATURE = "logit_qmax"  # vLLM's estimator feature: log-odds of the draft's top token, clamped to +-40


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval of k successes in n trials ((nan, nan) when n = 0).

    >>> [round(x, 4) for x in wilson(8, 10)]
    [0.4902, 0.9433]
    """
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def position_table(drafts: int, accepted: list[int]) -> list[dict]:
    """Per position: reached, accepted, conditional and survival with intervals; `accepted` [K] non-increasing."""
    reached = [drafts, *accepted[:-1]]
    out = []
    for j, (a, r) in enumerate(zip(accepted, reached)):
        lo, hi = wilson(a, r)
        slo, shi = wilson(a, drafts)
        out.append({"position": j, "reached": r, "accepted": a,
                    "conditional": a / r if r else float("nan"), "conditional_lo": lo, "conditional_hi": hi,
                    "survival": a / drafts if drafts else float("nan"), "survival_lo": slo, "survival_hi": shi})
    return out


def _group(drafts: int, accepted: list[int], **labels) -> dict:
    return {**labels, "drafts": drafts, "mean_accepted_length": sum(accepted) / drafts if drafts else float("nan"),
            "positions": position_table(drafts, accepted)}


def acceptance_groups(rows: pl.DataFrame, k: int) -> list[dict]:
    """Trace rows -> one group per (dataset, temperature), then the pooled group (module glossary)."""
    steps = (rows.filter(pl.col("verified") & (pl.col("position") == 0))
             .group_by("dataset", "temperature").len(name="drafts"))
    acc = (rows.filter(pl.col("accepted").fill_null(False))
           .group_by("dataset", "temperature", "position").len(name="accepted"))
    keys = steps.with_columns(pl.col("dataset").cast(pl.Utf8)).sort("dataset", "temperature")
    acc = acc.with_columns(pl.col("dataset").cast(pl.Utf8))
    table = np.zeros((keys.height, k), dtype=np.int64)  # [groups, K] accepted per position
    index = {(d, t): i for i, (d, t) in enumerate(zip(keys["dataset"], keys["temperature"]))}
    for d, t, j, n in acc.iter_rows():
        if (d, t) in index and j < k:
            table[index[d, t], j] = n
    drafts = keys["drafts"].to_numpy()
    groups = [_group(int(n), table[i].tolist(), dataset=d, temperature=round(float(t), 6))
              for i, (d, t, n) in enumerate(zip(keys["dataset"], keys["temperature"], drafts))]
    temps = sorted({g["temperature"] for g in groups})
    pooled = _group(int(drafts.sum()), table.sum(axis=0).tolist(), dataset="all",
                    temperature=temps[0] if len(temps) == 1 else None)
    return [*groups, pooled]


def fitted_coefficients(rows: pl.DataFrame, k: int, trained_on: dict) -> dict:
    """The batch fit of vLLM's acceptance model on every labelled slot, as a coefficients.json document."""
    obs = rows.filter(pl.col("accepted").is_not_null())
    est = BatchLogistic(k, EstimatorConfig(feature=FEATURE))
    est.fit(obs[FEATURE].to_numpy().astype(np.float64), obs["position"].to_numpy().astype(np.intp),
            obs["accepted"].cast(pl.Float64).to_numpy())
    return coefficients_document(est, trained_on, with_state=False)


def acceptance_profile(rows: pl.DataFrame, k: int, meta: dict[str, str]) -> dict:
    """The profile of trace `rows` (K positions; `meta`: the first trace's file metadata)."""
    pair = {"target": meta.get("avkit.target", ""), "draft": meta.get("avkit.draft", ""),
            "target_sha256": meta.get("avkit.target_sha256", ""), "draft_sha256": meta.get("avkit.draft_sha256", ""),
            "drafter": meta.get("avkit.drafter", "model"), "k": k, "engine": meta.get("avkit.engine", "native")}
    trained = {key: pair[key] for key in ("target", "draft", "target_sha256", "draft_sha256")}
    trained["drafter"] = "suffix" if pair["drafter"] == "suffix" else "model"
    return {"pair": pair, "groups": acceptance_groups(rows, k),
            "coefficients": fitted_coefficients(rows, k, trained)}
