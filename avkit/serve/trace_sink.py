"""The engine's TraceSink while serving: per-position metrics always, trace rows with --record.

Rows are held in memory and written every `flush_s` seconds (or at 65,536 rows) through
`SideWrites`, so a disk that fails (read-only, full) never fails a step or a request: the rows
stay in memory and the write is retried with backoff; `/metrics` shows how many rows are not on
disk yet (`avkit_trace_rows_unwritten`). At shutdown the file is closed (`<path>.partial` renamed
to `<path>`); if that fails, one log line says how many rows were never written and where the
rows flushed earlier are. Nothing is lost silently.
"""

from __future__ import annotations

import collections
import logging
import time

import numpy as np

from avkit.serve.side_writes import SideWrites

log = logging.getLogger("avkit.serve")

FLUSH_ROWS = 65536


class ServeSink:
    def __init__(self, metrics, writer=None, run_id: str = "", *, side_writes: SideWrites | None = None,
                 flush_s: float = 30.0):
        self.metrics, self.writer, self.run_id = metrics, writer, run_id
        self.side_writes = side_writes if side_writes is not None else SideWrites()
        self.flush_s = flush_s
        self._pending: collections.deque[dict] = collections.deque()  # column dicts not in the writer yet
        self._pending_rows = 0
        self.rows = 0  # rows produced
        self.persisted = 0  # rows known to be on disk (after the last successful flush)
        self._last_flush = time.monotonic()

    def emit(self, columns: dict[str, np.ndarray]) -> None:
        self.metrics.observe_rows(columns)
        if self.writer is None:
            return
        n = len(columns["position"])
        self._pending.append({"run_id": np.full(n, self.run_id, dtype=object), **columns})
        self._pending_rows += n
        self.rows += n
        self.metrics.trace_rows.inc(n)
        due = time.monotonic() - self._last_flush >= self.flush_s or self._pending_rows >= FLUSH_ROWS
        if due and self.side_writes.due("trace"):
            self._last_flush = time.monotonic()
            self.side_writes.run("trace", self._flush)
        self.metrics.trace_rows_unwritten.set(self.rows - self.persisted)

    def _hand_over(self) -> None:
        """Pending rows -> the writer's memory. A row batch leaves `_pending` before `write`: if that
        raises, the rows are in the writer already (its own row-group flush failed) and go out with
        the next successful flush, never twice."""
        while self._pending:
            cols = self._pending.popleft()
            self._pending_rows -= len(cols["position"])
            self.writer.write(cols)

    def _flush(self) -> None:
        self._hand_over()
        self.writer.flush()
        self.persisted = self.rows

    def close(self) -> None:
        """Write everything and rename the file into place; never raises (the log says what was lost)."""
        if self.writer is None:
            return

        def finish():
            self._hand_over()
            self.writer.close()
            self.persisted = self.rows

        if not self.side_writes.run("trace", finish, force=True):
            lost = self.rows - self.persisted
            path = self.writer.path
            log.error("--record %s: could not finish the trace (%s); %d of %d rows were never written to "
                      "disk%s", path, self.side_writes.reasons().get("trace", "unknown error"), lost, self.rows,
                      f"; the {self.persisted} rows written before are in {path}.partial" if self.persisted
                      else "")
        self.metrics.trace_rows_unwritten.set(self.rows - self.persisted)
