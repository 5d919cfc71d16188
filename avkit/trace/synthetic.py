"""Synthetic traces with known truth, for tests and benchmarks.

Layout: engine step e runs `batch_size` requests side by side; each request decodes
`steps_per_request` steps and drafts K slots per step. A slot's feature is
logit_qmax ~ Normal(mean of its dataset + depth_drift * position, feature_sd), and its
acceptance is a Bernoulli draw with the known truth
    P(accept) = sigmoid(slope * logit_qmax + intercepts[position]).
Censoring follows docs/estimator.md: a (request, step) verifies a prefix of its drafts (all of them,
or with probability `trim_prob` a uniformly random shorter prefix); a slot is observed iff it is
verified and at or before the first rejection, and `accepted` is null otherwise.
The file metadata key `avkit.synthetic` holds the truth as JSON.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from avkit.config import SyntheticConfig
from avkit.estimators.base import sigmoid
from avkit.staged import staged_file
from avkit.trace import labels
from avkit.trace import schema as S


def _dict_column(codes: np.ndarray, names: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pa.array(names, pa.string()))


def synthetic_trace(cfg: SyntheticConfig | None = None, steps_before: int = 0) -> pa.Table:
    """A trace table (schema v1, with metadata) drawn from the known truth in `cfg`, its engine steps (and
    request ids) after `steps_before` earlier ones (a multiple of `steps_per_request`: whole requests)."""
    cfg = cfg or SyntheticConfig()
    rng = np.random.default_rng(cfg.seed)
    # who drafts when: [M] arrays over (request, step) pairs, M = ceil(num_slots / K)
    m, k = -(-cfg.num_slots // cfg.k), cfg.k
    engine_step = np.arange(m) // cfg.batch_size
    request = (engine_step // cfg.steps_per_request) * cfg.batch_size + np.arange(m) % cfg.batch_size  # [M]
    num_requests = int(request.max()) + 1
    requests_before = steps_before // cfg.steps_per_request * cfg.batch_size
    dataset_of_request = rng.choice(len(cfg.datasets), size=num_requests, p=np.asarray(cfg.mix) / sum(cfg.mix))
    trimmed = rng.uniform(size=m) < cfg.trim_prob
    lay = {"engine_step": engine_step, "request": request, "step": engine_step % cfg.steps_per_request,
           "dataset": dataset_of_request[request], "batch_size": np.bincount(engine_step)[engine_step],  # [M]
           "num_verified": np.where(trimmed, rng.integers(0, cfg.k, size=m), cfg.k)}  # [M] verified prefix
    pos = np.broadcast_to(np.arange(k), (m, k))  # [M, K]
    mean = np.asarray(cfg.feature_means)[lay["dataset"]][:, None] + cfg.depth_drift * pos  # [M, K]
    f = np.clip(rng.normal(mean, cfg.feature_sd), -40, 40).astype(np.float32)  # [M, K] logit_qmax
    p_true = sigmoid(cfg.slope * f.astype(np.float64) + np.asarray(cfg.intercepts)[pos])  # [M, K]
    draw = rng.uniform(size=(m, k)) < p_true  # the target's decision if verified
    verified = pos < lay["num_verified"][:, None]  # [M, K]
    # accepted length = leading run of accepted draws inside the verified prefix
    num_accepted = np.cumprod(draw & verified, axis=1).sum(axis=1)  # [M]
    observed = labels.observed(pos, lay["num_verified"][:, None], num_accepted[:, None])  # [M, K]
    q_max = sigmoid(f.astype(np.float64))
    q_2nd = (1.0 - q_max) * rng.uniform(0.3, 1.0, size=(m, k)) * np.minimum(1.0, q_max / (1 - q_max + 1e-300))
    entropy = -(q_max * np.log(q_max)) - np.where(q_max < 1, (1 - q_max) * np.log1p(-q_max), 0.0) \
        + (1 - q_max) * np.log(50.0)
    took_top = rng.uniform(size=(m, k)) < q_max
    q_sampled = np.where(took_top, q_max, q_2nd * rng.uniform(0.2, 1.0, size=(m, k)))
    head = sigmoid(np.log(p_true / (1 - p_true + 1e-300)) + rng.normal(0, 0.5, size=(m, k)))
    step_ms = (20.0 + 2.0 * lay["batch_size"] + rng.exponential(2.0, size=m)).astype(np.float32)
    # [M, K] arrays flattened row-major (request-step major, position minor) into the trace columns
    rep = lambda a: np.repeat(a, k)  # [M] -> [M*K]
    flat = lambda a, dtype=np.float32: np.asarray(a).reshape(-1).astype(dtype)  # [M, K] -> [M*K]
    cols = {
        "run_id": _dict_column(np.zeros(m * k), ["synthetic"]),
        "dataset": _dict_column(rep(lay["dataset"]), list(cfg.datasets)),
        "request_id": _dict_column(rep(lay["request"]), [f"req-{requests_before + i}" for i in range(num_requests)]),
        "drafter": _dict_column(np.zeros(m * k), ["model"]),
        "step": pa.array(rep(lay["step"]).astype(np.int32)),
        "position": pa.array(np.tile(np.arange(k, dtype=np.int16), m)),
        "draft_token": pa.array(rng.integers(0, 1000, size=m * k, dtype=np.int32)),
        **{name: pa.array(flat(a)) for name, a in (("q_max", q_max), ("q_2nd", q_2nd), ("q_sampled", q_sampled),
                                                      ("entropy", entropy), ("logit_qmax", f))},
        "target_prob": pa.array(flat(p_true * q_sampled), mask=~flat(verified, bool)),
        "verified": pa.array(flat(verified, bool)),
        "accepted": pa.array(flat(draw, bool), mask=~flat(observed, bool)),
        "num_drafted": pa.array(np.full(m * k, k, dtype=np.int16)),
        "num_verified": pa.array(rep(lay["num_verified"]).astype(np.int16)),
        "num_accepted": pa.array(rep(num_accepted).astype(np.int16)),
        "batch_size": pa.array(rep(lay["batch_size"]).astype(np.int32)),
        "step_time_ms": pa.array(rep(step_ms)),
        "temperature": pa.array(np.ones(m * k, dtype=np.float32)),
        "top_p": pa.array(np.full(m * k, 0.95, dtype=np.float32)),
        "engine_step": pa.array(rep(lay["engine_step"]).astype(np.int64) + steps_before),
        "accept_prob": pa.array(flat(p_true), mask=~flat(verified, bool)),
        "confidence": pa.nulls(m * k, pa.float32()),
        "head_conf": pa.array(flat(head)),
        "match_len": pa.nulls(m * k, pa.int16()),
        "cache_score": pa.nulls(m * k, pa.float32()),
    }
    n_rows = min(m * k, cfg.num_slots)
    table = pa.table({name: arr[:n_rows] for name, arr in cols.items()}, schema=S.TRACE_SCHEMA)
    return table.replace_schema_metadata(_metadata(cfg))


def _metadata(cfg: SyntheticConfig) -> dict[str, str]:
    truth = {"slope": cfg.slope, "intercepts": list(cfg.intercepts), "seed": cfg.seed}
    return {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION, **S.run_metadata(
        "synthetic", "synthetic", k=cfg.k, temperature="1.0", top_p="0.95", drafter="model", seed=cfg.seed,
        datasets=list(cfg.datasets), policy="synthetic-trim", synthetic=json.dumps(truth))}


def write_synthetic_trace(path, cfg: SyntheticConfig | None = None, row_group_rows: int = 1 << 20,
                          chunk_slots: int = 1 << 22) -> Path:
    """Draw a synthetic trace and write it as zstd Parquet (temp file, then rename), chunk by chunk (memory stays
    flat): each chunk of whole requests has its own seed from `cfg.seed`, so one chunk is `synthetic_trace(cfg)`."""
    cfg = cfg or SyntheticConfig()
    path = Path(path)
    unit = cfg.k * cfg.batch_size * cfg.steps_per_request  # slots of one batch of whole requests
    step = max(unit, chunk_slots // unit * unit)
    with staged_file(path, "path") as tmp, \
            pq.ParquetWriter(tmp, S.TRACE_SCHEMA.with_metadata(_metadata(cfg)), compression="zstd") as w:
        for index, start in enumerate(range(0, cfg.num_slots, step)):
            seed = cfg.seed if index == 0 else int(np.random.SeedSequence([cfg.seed, index]).generate_state(1)[0])
            chunk = replace(cfg, num_slots=min(step, cfg.num_slots - start), seed=seed)
            w.write_table(synthetic_trace(chunk, start // cfg.k // cfg.batch_size), row_group_size=row_group_rows)
    return path


__all__ = ["synthetic_trace", "write_synthetic_trace"]
