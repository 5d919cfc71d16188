"""Where the engine sends its trace rows: a `TraceSink` receives one batch of columns per step.

The engine does no file I/O; the record command plugs in a sink that buffers rows into a
`TraceWriter`, tests use `MemorySink`. Columns follow `avkit.trace.schema` (one row per draft
slot); the engine does not know the run id, so `run_id` is the sink's to add. Nullable columns
(`target_prob`, `accepted`, `accept_prob`, `confidence`, ...) arrive as `numpy.ma.MaskedArray`
with mask True = null (`pyarrow.array` turns the mask into nulls); string columns are object arrays.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


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
        names = self.batches[0].keys()
        out = {}
        for name in names:
            parts = [b[name] for b in self.batches]
            is_masked = any(isinstance(p, np.ma.MaskedArray) for p in parts)
            out[name] = np.ma.concatenate(parts) if is_masked else np.concatenate(parts)
        return out

    def __len__(self) -> int:
        return sum(len(next(iter(b.values()))) for b in self.batches if b)


__all__ = ["MemorySink", "TraceSink"]
