"""Writes beside the requests (coefficient and cost snapshots, --record rows): they may fail, requests may not
(docs/runtime.md, "Serving": kinds, reasons, backoff, the --record sink)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

import numpy as np

log = logging.getLogger("avkit.serve")

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 60.0
FLUSH_ROWS = 65536  # --record rows held before a flush is due


class SideWrites:
    """Runs side writes by kind; remembers which kinds are failing and when each may retry."""

    def __init__(self, failures_counter=None, *, clock: Callable[[], float] = time.monotonic):
        self.failures = failures_counter  # prometheus Counter labelled by kind, or None
        self._clock = clock
        self._lock = threading.Lock()
        self._failing: dict[str, tuple[str, int, float]] = {}  # kind -> (reason, failures in a row, retry time)

    def due(self, kind: str) -> bool:
        """False while `kind` is backing off after a failure."""
        return self._clock() >= self._failing.get(kind, ("", 0, 0.0))[2]

    def run(self, kind: str, write: Callable[[], object], *, force: bool = False) -> bool:
        """Call `write()` unless `kind` is backing off (`force` ignores the backoff); True if it succeeded."""
        if not force and not self.due(kind):
            return False
        try:
            write()
        except Exception as e:  # any failure of a side write is contained here
            strerror = getattr(e, "strerror", None) if isinstance(e, OSError) else None  # errno text: no path
            with self._lock:
                streak = self._failing.get(kind, ("", 0, 0.0))[1] + 1
                self._failing[kind] = (f"{type(e).__name__}: {strerror}" if strerror else type(e).__name__, streak,
                                       self._clock() + min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** (streak - 1)))
            if self.failures is not None:
                self.failures.labels(kind=kind).inc()
            if streak == 1:
                log.error("%s write failed (%s: %s); requests are unaffected, retrying with backoff, "
                          "/health reports degraded until it succeeds", kind, type(e).__name__, e)
            return False
        with self._lock:
            was = self._failing.pop(kind, None)
        if was is not None:
            log.warning("%s write recovered", kind)
        return True

    def reasons(self) -> dict[str, str]:
        """kind -> reason for every kind failing now (empty when all side writes are healthy)."""
        with self._lock:
            return {kind: reason for kind, (reason, _, _) in self._failing.items()}


class ServeSink:
    """The engine's `TraceSink` while serving (module doc): metrics, and --record rows through `side_writes`."""

    def __init__(self, metrics, writer, run_id: str, side_writes: SideWrites, flush_s: float = 30.0):
        self.metrics, self.writer, self.run_id = metrics, writer, run_id
        self.side_writes, self.flush_s = side_writes, flush_s
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

    def _flush(self, close: bool = False) -> None:
        """Pending rows -> the writer, then its flush (or close: the file renamed into place). A row batch
        leaves `_pending` before `write`: if that raises, the rows are in the writer already (its own row-group
        flush failed) and go out with the next successful flush, never twice."""
        while self._pending:
            cols = self._pending.popleft()
            self._pending_rows -= len(cols["position"])
            self.writer.write(cols)
        if close:
            self.writer.close()
        else:
            self.writer.flush()
        self.persisted = self.rows

    def close(self) -> None:
        """Write everything and rename the file into place; never raises (the log says what was lost)."""
        if self.writer is None:
            return
        if not self.side_writes.run("trace", lambda: self._flush(close=True), force=True):
            lost = self.rows - self.persisted
            path = self.writer.path
            log.error("--record %s: could not finish the trace (%s); %d of %d rows were never written to "
                      "disk%s", path, self.side_writes.reasons().get("trace", "unknown error"), lost, self.rows,
                      f"; the {self.persisted} rows written before are in {path}.partial" if self.persisted
                      else "")
        self.metrics.trace_rows_unwritten.set(self.rows - self.persisted)
