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


def trace_rows(batch, inp: DraftInput, draft: DraftProposal, num_verify: torch.Tensor,
               result: RejectionResult, confidences: torch.Tensor | None, *, engine_step: int,
               step_time_ms: float) -> dict[str, np.ndarray]:
    """Columns for the slots of this step, in (request, position) order (built on the host: each [B, K]
    tensor is copied once, wherever it lives)."""
    B, K = draft.tokens.shape
    k = result.accepted.shape[1]  # verified width (<= K)
    j = torch.arange(K)
    slot_mask = j[None, :] < draft.num_drafted.cpu()[:, None]  # [B, K]
    r_idx, j_idx = (x.numpy() for x in slot_mask.nonzero(as_tuple=True))  # [N] each

    def pad(x: torch.Tensor, fill) -> torch.Tensor:  # [B, k] -> [B, K]
        return torch.cat([x, torch.full((B, K - k), fill, dtype=x.dtype, device=x.device)], dim=1)

    def pick(x: torch.Tensor) -> np.ndarray:  # [B, K] -> [N]
        return x.detach().cpu().numpy()[r_idx, j_idx]

    verified = pick(j[None, :] < num_verify.cpu()[:, None])
    observed = pick(pad(result.observed, False))
    accepted = pick(pad(result.accepted, False))
    target_prob = pick(pad(result.target_prob.float(), float("nan"))).astype(np.float32)
    q_sampled = pick(draft.q_sampled.float()).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        accept_prob = np.minimum(1.0, target_prob / q_sampled).astype(np.float32)
    feats = {name: pick(draft.features[name].float()).astype(np.float32)
             for name in ("q_max", "q_2nd", "entropy", "logit_qmax")}

    def per_request(values, dtype) -> np.ndarray:
        return np.asarray(values, dtype=dtype)[r_idx]

    cols: dict[str, np.ndarray] = {
        "dataset": per_request([s.req.dataset for s in batch], object),
        "request_id": per_request([s.req.request_id for s in batch], object),
        "drafter": per_request(draft.kind, object),
        "step": per_request([s.steps - 1 for s in batch], np.int32),  # steps already counted this one
        "position": j_idx.astype(np.int16),
        "draft_token": pick(draft.tokens).astype(np.int32),
        **feats,
        "q_sampled": q_sampled,
        "target_prob": np.ma.MaskedArray(target_prob, mask=~verified),
        "verified": verified,
        "accepted": np.ma.MaskedArray(accepted, mask=~observed),
        "num_drafted": per_request(draft.num_drafted.tolist(), np.int16),
        "num_verified": per_request(num_verify.tolist(), np.int16),
        "num_accepted": per_request(result.num_accepted.tolist(), np.int16),
        "batch_size": np.full(len(r_idx), B, dtype=np.int32),
        "step_time_ms": np.full(len(r_idx), step_time_ms, dtype=np.float32),
        "temperature": pick(inp.temperature[:, None].expand(B, K)).astype(np.float32),
        "top_p": pick(inp.top_p[:, None].expand(B, K)).astype(np.float32),
        "engine_step": np.full(len(r_idx), engine_step, dtype=np.int64),
        "accept_prob": np.ma.MaskedArray(accept_prob, mask=~verified),
    }
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
