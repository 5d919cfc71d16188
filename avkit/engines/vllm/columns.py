"""vLLM records (one per verified request-step, from hooks.py) -> trace columns (avkit/trace/schema.py), in the
plugin's Observer (plugin.py).

A record holds K drafted slots: `draft_token` [K], `features` [K][F + 1] (hooks.FEATURES, then q_sampled),
`target_prob` [num_verified], `drafter` (`model`, or vLLM's cache method `ngram` / `suffix`: then K is the
draft's own length), and the step's `num_drafted`, `num_verified`, `num_accepted`, `batch_size`, `step`. Labels as everywhere (docs/estimator.md): slot j is accepted iff j < num_accepted, rejected iff
j == num_accepted < num_verified, censored (null) otherwise; unverified slots have no p(x).
"""

from __future__ import annotations

import numpy as np

from avkit.engines.vllm.hooks import FEATURES
from avkit.trace import labels


def slot_columns(records: list[dict], requests: dict[str, tuple[str, str, float, float]], step_time_ms: float,
                 engine_step: int) -> dict[str, np.ndarray]:
    """Columns for one engine step's records, in (record, position) order; `requests`: vLLM's request id ->
    (the tables' request id, dataset, temperature, top-p)."""
    k = np.array([r["num_drafted"] for r in records], dtype=np.int64)  # [R]
    r_idx = np.repeat(np.arange(len(records)), k)  # [N]
    j = np.arange(len(r_idx)) - np.repeat(np.cumsum(k) - k, k)  # [N] position within the record

    def per_record(key, dtype) -> np.ndarray:  # [N]
        return np.array([r[key] for r in records], dtype=dtype)[r_idx]

    def per_request(i: int, dtype) -> np.ndarray:  # [N]
        return np.array([requests[r["request_id"]][i] for r in records], dtype=dtype)[r_idx]

    feats = np.concatenate([np.asarray(r["features"], dtype=np.float32).reshape(-1, len(FEATURES) + 1)
                            for r in records])  # [N, F + 1]
    n_ver, n_acc = per_record("num_verified", np.int64), per_record("num_accepted", np.int64)
    verified = j < n_ver
    p = np.full(len(r_idx), np.nan, dtype=np.float32)  # [N]
    p[verified] = np.concatenate([np.asarray(r["target_prob"], dtype=np.float32) for r in records])
    q = feats[:, len(FEATURES)]
    with np.errstate(divide="ignore", invalid="ignore"):
        accept_prob = np.minimum(1.0, p / q).astype(np.float32)
    observed = labels.observed(j, n_ver, n_acc)
    return {
        "dataset": per_request(1, object),
        "request_id": per_request(0, object),
        "drafter": np.array([r.get("drafter", "model") for r in records], dtype=object)[r_idx],
        "step": per_record("step", np.int32),
        "position": j.astype(np.int16),
        "draft_token": np.concatenate([np.asarray(r["draft_token"], dtype=np.int32) for r in records]),
        **{name: feats[:, i] for i, name in enumerate(FEATURES)},
        "q_sampled": q,
        "target_prob": np.ma.MaskedArray(p, mask=~verified),
        "verified": verified,
        "accepted": np.ma.MaskedArray(j < n_acc, mask=~observed),
        "num_drafted": per_record("num_drafted", np.int16),
        "num_verified": n_ver.astype(np.int16),
        "num_accepted": n_acc.astype(np.int16),
        "batch_size": per_record("batch_size", np.int32),
        "step_time_ms": np.full(len(r_idx), step_time_ms, dtype=np.float32),
        "temperature": per_request(2, np.float32),
        "top_p": per_request(3, np.float32),
        "engine_step": np.full(len(r_idx), engine_step, dtype=np.int64),
        "accept_prob": np.ma.MaskedArray(accept_prob, mask=~verified),
    }


__all__ = ["slot_columns"]
