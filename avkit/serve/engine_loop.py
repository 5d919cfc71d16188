"""The one place the engine runs: a background thread doing continuous batching.

HTTP handlers `submit_all` (bounded: running + waiting <= max_concurrency + queue_size, else a 429) and read
events from an asyncio queue; `cancel` takes effect at the next step. Between steps the thread applies cancels
and admits waiting requests up to `max_concurrency`. Failure isolation: a request `add_request` refuses fails
alone; a step that raises fails its batch and a fresh engine takes over (the factory keeps models and policy,
so refits continue); the after-step hook cannot raise into the loop; if the thread dies, every request fails
with a 503 and /health says so. Its first act is `warm_up()` (`ready` False until then: /health `starting`).
Error events never carry exception text (the log has the traceback).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from avkit.errors import AvkitError
from avkit.serve.openai_api import ENGINE_DEAD, INTERNAL_ERROR, ApiError

log = logging.getLogger("avkit.serve")


@dataclass(frozen=True)
class Event:
    """What one engine step produced for one request (or why it ended)."""

    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None  # stop | length | abort | error
    error: ApiError | None = None  # why, when finish_reason == "error"


@dataclass
class RequestHandle:
    """The HTTP side of one request: events arrive on `events` in the server's event loop."""

    request: Any  # avkit.runtime.engine.Request
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def post(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


class EngineLoop:
    """Owns the engine and its thread; everything else talks to it through submit/cancel."""

    def __init__(self, make_engine: Callable[[], Any], *, max_concurrency: int, queue_size: int,
                 metrics, on_step: Callable[[], None] | None = None,
                 warm_up: Callable[[], None] | None = None, retry_after_s: int = 1):
        self._make_engine = make_engine
        self.warm_up = warm_up
        self.ready = warm_up is None  # True once the warm-up has run
        self._engine = make_engine()
        self.max_concurrency = max_concurrency
        self.queue_size, self.retry_after_s = queue_size, retry_after_s
        self._metrics = metrics
        self._on_step = on_step
        self._cv = threading.Condition()
        self._pending: collections.deque[RequestHandle] = collections.deque()
        self._running: dict[str, RequestHandle] = {}
        self._cancels: set[str] = set()
        self._accepting = True
        self._stop = False
        self.dead: str | None = None  # why the engine thread died (None while it runs)
        self._thread = threading.Thread(target=self._run, name="avkit-engine", daemon=True)

    # ---- called from the HTTP side ---------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    def submit_all(self, requests: list, loop: asyncio.AbstractEventLoop) -> list[RequestHandle]:
        """Queue every request or none (ApiError 429 when full, 503 when shutting down or dead)."""
        handles = [RequestHandle(r, loop) for r in requests]
        with self._cv:
            if self.dead is not None:
                raise ApiError(503, ENGINE_DEAD)
            if not self._accepting:
                raise ApiError(503, "server is shutting down")
            if len(self._pending) + len(self._running) + len(handles) > self.max_concurrency + self.queue_size:
                raise ApiError(429, f"server busy ({len(self._running)} running and {len(self._pending)} queued); "
                                    "retry later", headers={"Retry-After": str(self.retry_after_s)})
            self._pending.extend(handles)
            self._gauges()
            self._cv.notify()
        return handles

    def cancel(self, request_id: str) -> None:
        """Drop a request: from the queue now, from the engine at the next step."""
        with self._cv:
            for h in self._pending:
                if h.request_id == request_id:
                    self._pending.remove(h)
                    self._gauges()
                    return
            if request_id in self._running:
                self._cancels.add(request_id)  # applied before the next step
                self._cv.notify()

    def begin_drain(self) -> None:
        """Stop admitting: later submits raise a 503. Lock-free: called from a signal handler."""
        self._accepting = False

    def shutdown(self, grace_s: float, join_s: float = 30.0) -> None:
        """Stop admitting, let in-flight requests finish for up to grace_s, cancel the rest, join the
        thread for up to join_s more (a step in progress ends first; a hung one is left behind)."""
        self.begin_drain()
        deadline = time.monotonic() + grace_s
        with self._cv:
            while (self._pending or self._running) and self.dead is None and time.monotonic() < deadline:
                self._cv.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
            for h in [*self._pending, *self._running.values()]:
                h.post(Event([], True, "abort"))
            self._cancels.update(self._running)
            self._pending.clear()
            self._stop = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=join_s)
            if self._thread.is_alive():
                log.error("engine thread still busy %.0f s after shutdown; exiting without it", join_s)

    # ---- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self.warm_up is not None:
                self.warm_up()
                self.ready = True
            self._loop()
        except BaseException as e:  # the thread's last words: fail everyone cleanly
            log.critical("engine thread died:\n%s", traceback.format_exc())
            with self._cv:
                self.dead = f"{type(e).__name__}"
                failed = [*self._pending, *self._running.values()]
                self._pending.clear()
                self._running = {}
                self._gauges()
                self._cv.notify_all()
            for h in failed:
                h.post(Event([], True, "error", ApiError(503, ENGINE_DEAD)))

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._stop or self._pending or self._cancels or self._running):
                    self._cv.wait()
                admit = []
                while self._pending and len(self._running) < self.max_concurrency and not self._stop:
                    admit.append(self._pending.popleft())
                    self._running[admit[-1].request_id] = admit[-1]
            for h in admit:  # outside the lock; a cancel meanwhile lands in _cancels, applied below
                self._add(h)
            with self._cv:
                cancels, self._cancels = self._cancels, set()
                gone = [rid for rid in cancels if self._running.pop(rid, None) is not None]
                self._gauges()
                self._cv.notify_all()
            for rid in gone:
                self._engine.abort(rid)
            if self._stop:
                return
            if self._running:
                self._step()
            if self._on_step is not None:
                try:
                    self._on_step()
                except Exception:  # side writes are guarded upstream; this is the backstop
                    log.error("after-step hook failed:\n%s", traceback.format_exc())

    def _add(self, h: RequestHandle) -> None:
        """Into the engine; a request it refuses fails alone (400 for its own error, else 500)."""
        try:
            self._engine.add_request(h.request)
            return
        except AvkitError as e:
            event = Event([], True, "error", ApiError(400, str(e)))
        except Exception:
            log.error("add_request %s failed:\n%s", h.request_id, traceback.format_exc())
            event = Event([], True, "error", ApiError(500, INTERNAL_ERROR))
        with self._cv:
            self._running.pop(h.request_id, None)
        h.post(event)

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            outputs = self._engine.step()
        except Exception:
            log.error("engine step failed:\n%s", traceback.format_exc())
            self._metrics.engine_errors.inc()
            self._fail_running()
            return
        self._metrics.step_seconds.observe(time.perf_counter() - t0)
        ratio = self._engine.stats.cost_ratio
        if ratio is not None and ratio == ratio:  # the policy predicted this step (NaN: nothing predicted)
            self._metrics.step_time_ratio.observe(ratio)
        for out in outputs:
            handle = self._running.get(out.request_id)
            if handle is None:  # cancelled meanwhile
                continue
            ids = [int(t) for t in out.new_token_ids]
            self._metrics.generation_tokens.inc(len(ids))
            handle.post(Event(ids, bool(out.finished), out.finish_reason if out.finished else None))
            if out.finished:
                with self._cv:
                    self._running.pop(out.request_id, None)
                    self._gauges()
                    self._cv.notify_all()

    def _fail_running(self) -> None:
        with self._cv:
            failed, self._running = list(self._running.values()), {}
            self._gauges()
            self._cv.notify_all()
        for h in failed:
            h.post(Event([], True, "error", ApiError(500, INTERNAL_ERROR)))
        self._engine = self._make_engine()

    def _gauges(self) -> None:
        self._metrics.queue_depth.set(len(self._pending))
        self._metrics.running.set(len(self._running))
