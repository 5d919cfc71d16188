"""The recording sink: the engine's per-step rows go to the TraceWriter and the running stats."""

from __future__ import annotations

import numpy as np

from avkit.record.stats import AcceptanceStats
from avkit.trace.writer import TraceWriter


class RecordingSink:
    """A `TraceSink` that adds the run id, counts labelled slots and buffers rows into a writer."""

    def __init__(self, writer: TraceWriter, run_id: str, stats: AcceptanceStats):
        self.writer = writer
        self.run_id = run_id
        self.stats = stats
        self.rows = 0  # rows received from the engine in this run

    def emit(self, columns: dict[str, np.ndarray]) -> None:
        n = len(next(iter(columns.values()), ()))
        if n == 0:
            return
        columns = dict(columns)
        columns.setdefault("run_id", np.full(n, self.run_id, dtype=object))
        self.stats.update(columns)
        self.writer.write(columns)
        self.rows += n
