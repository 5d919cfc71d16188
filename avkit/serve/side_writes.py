"""Writes the server makes beside the requests (coefficient snapshot, trace rows): they may fail,
the requests may not.

Rule: a failing side write never fails a request and never stops the engine. Each
failure is counted on `/metrics` (`avkit_side_write_failures_total{kind}`), logged once per kind
until that kind succeeds again (then one "recovered" line), and retried with exponential backoff
(1 s, 2 s, 4 s ... capped at 60 s); meanwhile `/health` reports `degraded` with the reason.
Glossary:
  kind      what is written: "snapshot" (live coefficients) or "trace" (--record rows)
  reason    what /health shows: the exception type and, for an OS error, its errno text
            ("PermissionError: Permission denied"), never a path; the log line has the full message
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("avkit.serve")

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 60.0


def public_reason(error: BaseException) -> str:
    """The exception type and, for an OS error, its errno text: no path, no message that may hold one."""
    strerror = getattr(error, "strerror", None) if isinstance(error, OSError) else None
    return f"{type(error).__name__}: {strerror}" if strerror else type(error).__name__


class SideWrites:
    """Runs side writes by kind; remembers which kinds are failing and when each may retry."""

    def __init__(self, failures_counter=None, *, clock: Callable[[], float] = time.monotonic):
        self.failures = failures_counter  # prometheus Counter labelled by kind, or None
        self._clock = clock
        self._lock = threading.Lock()
        self._reasons: dict[str, str] = {}  # kind -> reason, while that kind is failing
        self._streak: dict[str, int] = {}  # kind -> consecutive failures
        self._retry_at: dict[str, float] = {}  # kind -> monotonic time of the next attempt

    def due(self, kind: str) -> bool:
        """False while `kind` is backing off after a failure."""
        return self._clock() >= self._retry_at.get(kind, 0.0)

    def run(self, kind: str, write: Callable[[], object], *, force: bool = False) -> bool:
        """Call `write()` unless `kind` is backing off (`force` ignores the backoff); True if it succeeded."""
        if not force and not self.due(kind):
            return False
        try:
            write()
        except Exception as e:  # any failure of a side write is contained here
            self.failed(kind, e)
            return False
        self.succeeded(kind)
        return True

    def failed(self, kind: str, error: BaseException) -> None:
        reason = public_reason(error)
        with self._lock:
            first = kind not in self._reasons
            self._reasons[kind] = reason
            streak = self._streak[kind] = self._streak.get(kind, 0) + 1
            self._retry_at[kind] = self._clock() + min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** (streak - 1))
        if self.failures is not None:
            self.failures.labels(kind=kind).inc()
        if first:
            log.error("%s write failed (%s: %s); requests are unaffected, retrying with backoff, "
                      "/health reports degraded until it succeeds", kind, type(error).__name__, error)

    def succeeded(self, kind: str) -> None:
        with self._lock:
            was = self._reasons.pop(kind, None)
            self._streak.pop(kind, None)
            self._retry_at.pop(kind, None)
        if was is not None:
            log.warning("%s write recovered", kind)

    def reasons(self) -> dict[str, str]:
        """kind -> reason for every kind failing now (empty when all side writes are healthy)."""
        with self._lock:
            return dict(self._reasons)
