"""Writes beside the requests (coefficient and cost snapshots, --record rows): they may fail, requests may not
(docs/runtime.md, "Serving": kinds, reasons, backoff, the --record sink, snapshots)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from avkit.estimators.coefficients import ServedPair, coefficients_document
from avkit.staged import write_json_atomic

log = logging.getLogger("avkit.serve")

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 60.0
FLUSH_ROWS = 65536  # --record rows held before a flush is due
COST_SNAPSHOT = "learned_cost.json"  # beside the coefficients snapshot


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


def cache_snapshot_of(path: Path) -> Path:
    """The cache estimator's snapshot beside the model estimator's: coefficients.json -> coefficients.cache.json."""
    return path.with_name(f"{path.stem}.cache{path.suffix or '.json'}")


def coefficients_of(estimator, pair: ServedPair | None = None, drafter: str = "model") -> dict[str, Any] | None:
    """Estimator state -> coefficients.json dict (None when the estimator has no slope/intercepts), mode
    "online", `trained_on` naming this server, the snapshot time, the served `pair` and (`drafter`
    "suffix": the hybrid drafter's cache rows) the rows it scored."""
    return coefficients_document(estimator, {
        "source": "avkit serve", "snapshot_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(asdict(pair) if pair is not None else {}), **({"drafter": drafter} if drafter != "model" else {})},
        mode="online")


class Snapshots:
    """Publishes coefficients after each refit; writes `path` (and the cache estimator's beside it) every
    `every` refits, the learned cost model (the adaptive policy's `learner`) to COST_SNAPSHOT beside it every
    `cost_every` learned steps, and both at `close`, each through `side_writes` (kinds "snapshot", "cost")."""

    def __init__(self, policy, path: Path | None, every: int, pair: ServedPair | None, side_writes: SideWrites,
                 cost_every: int = 512):
        self.side_writes = side_writes
        self._policy, self._pair = policy, pair
        self._estimator = getattr(policy, "estimator", None)  # only the adaptive policy has one (and counts refits)
        self.learner = getattr(policy, "learner", None)  # only the adaptive policy learns its cost
        self.path, self.every, self.cost_every = path, every, cost_every
        self.refits = 0  # refit rounds seen since start
        self.cache_refits = 0  # the cache estimator's (hybrid drafter), counted apart
        self._last_written = 0  # refits + cache_refits at the last write
        self._current = self._read()

    def current(self) -> dict[str, Any] | None:
        return self._current

    def on_step(self) -> None:
        """Engine thread, after each step: publish after a refit; snapshot every `every` refits (of either
        estimator); the cost model every `cost_every` learned steps."""
        if self.learner is not None and self.learner.steps and self.learner.steps % self.cost_every == 0:
            self.side_writes.run("cost", self.write_cost)
        if self._estimator is None:
            return
        refits, cache_refits = self._policy.refits, self._policy.cache_refits
        if (refits, cache_refits) == (self.refits, self.cache_refits):
            return
        self.refits, self.cache_refits = refits, cache_refits
        self._current = self._read()
        if self.refits + self.cache_refits - self._last_written >= self.every:
            self.side_writes.run("snapshot", self.write)

    def close(self) -> None:
        """Write both now (shutdown); never raises: each failure is the side writes' to report."""
        self.side_writes.run("snapshot", self.write, force=True)
        self.side_writes.run("cost", self.write_cost, force=True)

    def write(self) -> None:
        coeffs = self._read()
        if self.path is None or coeffs is None:
            return
        cache = self._read("suffix")
        if cache is not None:
            write_json_atomic(cache_snapshot_of(self.path), cache)
        write_json_atomic(self.path, coeffs)
        self._last_written = self.refits + self.cache_refits
        log.info("coefficients snapshot -> %s%s (refit %d)", self.path,
                 f" and {cache_snapshot_of(self.path).name}" if cache is not None else "", self.refits)

    def write_cost(self) -> None:
        if self.learner is None or self.path is None:
            return
        self.learner.snapshot(self.path.with_name(COST_SNAPSHOT))
        log.info("learned cost model -> %s (%d steps)", self.path.with_name(COST_SNAPSHOT), self.learner.steps)

    def _read(self, drafter: str = "model") -> dict[str, Any] | None:
        """The model estimator's snapshot (`drafter` "suffix": the cache estimator's), with its refit count."""
        estimator, refits = (self._estimator, self.refits) if drafter == "model" else \
            (self._policy.cache_estimator, self.cache_refits)
        c = coefficients_of(estimator, self._pair, drafter) if estimator is not None else None
        if c is not None:
            c["refits"] = refits  # refits of this server process
        return c
