"""One step's trace rows, one per draft slot (request r, position j < num_drafted_r), and where they go.

Columns and their meaning are those of `avkit.trace.schema` (all but `run_id`, which the sink
adds). Labels (docs/estimator.md): a slot is observed iff verified and at or before the first
rejection; `accepted` is null otherwise (censored). Nullable columns (`target_prob`, `accepted`,
`accept_prob`, `confidence`, ...) are `numpy.ma.MaskedArray`s with mask True = null (`pyarrow.array`
turns the mask into nulls); string columns are object arrays.
The engine does no file I/O: it hands each step's columns to a `TraceSink` (`record` buffers them into a
`TraceWriter`, `serve` into metrics and --record, tests and benchmarks keep them in a `MemorySink`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from avkit.drafters.base import DraftInput, DraftProposal
from avkit.kernels.rejection_ref import RejectionResult


# per-request columns and their dtypes (avkit.trace.schema), repeated over the request's slots
REQUEST_COLUMNS = {"dataset": object, "request_id": object, "drafter": object, "step": np.int32,
                   "num_drafted": np.int16, "num_verified": np.int16, "num_accepted": np.int16,
                   "batch_size": np.int32, "temperature": np.float32, "top_p": np.float32}


def slot_rows(r_idx: np.ndarray, position: np.ndarray, requests: dict[str, list], draft_token: np.ndarray,
              features: dict[str, np.ndarray], q_sampled: np.ndarray, target_prob: np.ndarray,
              accepted: np.ndarray, observed: np.ndarray, *, step_time_ms: float,
              engine_step: int) -> dict[str, np.ndarray]:
    """The trace columns of N draft slots, built once for every engine: `r_idx` [N] each slot's request,
    `position` [N], `requests` one value per request for each of REQUEST_COLUMNS, the rest [N] per slot
    (`target_prob` NaN where unverified). A slot is verified iff position < num_verified."""
    n = len(r_idx)
    cols = {name: np.asarray(requests[name], dtype=dtype)[r_idx] for name, dtype in REQUEST_COLUMNS.items()}
    verified = position < cols["num_verified"]  # [N]
    target_prob = target_prob.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        accept_prob = np.minimum(1.0, target_prob / q_sampled).astype(np.float32)
    return {**cols, "position": position.astype(np.int16), "draft_token": draft_token.astype(np.int32),
            **{name: f.astype(np.float32) for name, f in features.items()},
            "q_sampled": q_sampled.astype(np.float32),
            "target_prob": np.ma.MaskedArray(target_prob, mask=~verified), "verified": verified,
            "accepted": np.ma.MaskedArray(accepted.astype(bool), mask=~observed),
            "step_time_ms": np.full(n, step_time_ms, dtype=np.float32),
            "engine_step": np.full(n, engine_step, dtype=np.int64),
            "accept_prob": np.ma.MaskedArray(accept_prob, mask=~verified)}


def trace_rows(batch, inp: DraftInput, draft: DraftProposal, num_verify: torch.Tensor,
               result: RejectionResult, confidences: torch.Tensor | None, *, engine_step: int,
               step_time_ms: float) -> dict[str, np.ndarray]:
    """Columns for the slots of this step, in (request, position) order (built on the host: each [B, K]
    tensor is copied once, wherever it lives)."""
    B, K = draft.tokens.shape
    k = result.accepted.shape[1]  # verified width (<= K)
    slot_mask = torch.arange(K)[None, :] < draft.num_drafted.cpu()[:, None]  # [B, K]
    r_idx, j_idx = (x.numpy() for x in slot_mask.nonzero(as_tuple=True))  # [N] each

    def pick(x: torch.Tensor, fill=None) -> np.ndarray:  # [B, K] (or [B, k] padded with `fill`) -> [N]
        if fill is not None:
            x = torch.cat([x, torch.full((B, K - k), fill, dtype=x.dtype, device=x.device)], dim=1)
        return x.detach().cpu().numpy()[r_idx, j_idx]

    requests = {"dataset": [s.req.dataset for s in batch], "request_id": [s.req.request_id for s in batch],
                "drafter": draft.kind, "step": [s.steps - 1 for s in batch],  # steps already counted this one
                "num_drafted": draft.num_drafted.tolist(), "num_verified": num_verify.tolist(),
                "num_accepted": result.num_accepted.tolist(), "batch_size": [B] * B,
                "temperature": inp.temperature.tolist(), "top_p": inp.top_p.tolist()}
    cols = slot_rows(r_idx, j_idx, requests, pick(draft.tokens),
                     {name: pick(draft.features[name].float()) for name in ("q_max", "q_2nd", "entropy", "logit_qmax")},
                     pick(draft.q_sampled.float()), pick(result.target_prob.float(), float("nan")),
                     pick(result.accepted, False), pick(result.observed, False), step_time_ms=step_time_ms,
                     engine_step=engine_step)
    if confidences is not None:
        conf = pick(confidences.float()[:, :K]).astype(np.float32)
        cols["confidence"] = np.ma.MaskedArray(conf, mask=~np.isfinite(conf))
    for name, value in draft.extra.items():  # head_conf, match_len (int16), cache_score
        v = pick(value.float())
        dtype = np.int16 if name == "match_len" else np.float32
        cols[name] = np.ma.MaskedArray(np.nan_to_num(v).astype(dtype), mask=np.isnan(v))
    return cols


class TraceSink(Protocol):
    def emit(self, columns: dict[str, np.ndarray]) -> None:
        """Receive this step's rows: every array has the same length (rows = draft slots)."""
        ...


class MemorySink:
    """Keeps every emitted batch in memory; `columns()` concatenates them."""

    def __init__(self):
        self.batches: list[dict[str, np.ndarray]] = []

    def emit(self, columns: dict[str, np.ndarray]) -> None:
        self.batches.append(columns)

    def columns(self) -> dict[str, np.ndarray]:
        if not self.batches:
            return {}
        cat = lambda parts: (np.ma.concatenate if any(isinstance(p, np.ma.MaskedArray) for p in parts)
                             else np.concatenate)(parts)
        return {name: cat([b[name] for b in self.batches]) for name in self.batches[0]}

    def __len__(self) -> int:
        return sum(len(next(iter(b.values()))) for b in self.batches if b)
