"""The one place the engine runs: a background thread doing continuous batching, and its failure isolation
(docs/runtime.md, "Serving")."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from avkit.errors import AvkitError
from avkit.runtime.request import FINISH_ABORT, StepOutput
from avkit.serve.openai_api import ENGINE_DEAD, INTERNAL_ERROR, ApiError

log = logging.getLogger("avkit.serve")


@dataclass
class RequestHandle:
    """The HTTP side of one request: events arrive on `events` (shared by one `submit_all`'s requests) in the
    server's event loop."""

    request: Any  # avkit.runtime.request.Request
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # StepOutput | ApiError (the last event)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def post(self, event: StepOutput | ApiError) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


class EngineLoop:
    """Owns the engine and its thread; everything else talks to it through submit/cancel."""

    def __init__(self, make_engine: Callable[[], Any], *, max_concurrency: int, queue_size: int,
                 metrics, on_step: Callable[[], None] | None = None,
                 warm_up: Callable[[], None] | None = None, retry_after_s: int = 1):
        self._make_engine, self._engine = make_engine, make_engine()
        self.warm_up, self.ready = warm_up, warm_up is None  # ready: True once the warm-up has run
        self.capacity, self.retry_after_s = max_concurrency + queue_size, retry_after_s
        self._metrics, self._on_step = metrics, on_step
        self._cv = threading.Condition()
        self._handles: dict[str, RequestHandle] = {}  # every request in flight (new, waiting or running)
        self._new: list[RequestHandle] = []  # submitted, not handed to the engine yet
        self._cancels: set[str] = set()  # applied before the next step
        self._accepting, self._stop = True, False
        self.dead: str | None = None  # why the engine thread died (None while it runs)
        self._thread = threading.Thread(target=self._run, name="avkit-engine", daemon=True)

    # ---- called from the HTTP side ---------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def num_running(self) -> int:
        return len(self._engine.running)

    @property
    def queue_depth(self) -> int:
        return max(0, len(self._handles) - len(self._engine.running))

    def submit_all(self, requests: list, loop: asyncio.AbstractEventLoop) -> list[RequestHandle]:
        """Queue every request or none (ApiError 429 when full, 503 when shutting down or dead); their events
        share one queue."""
        events: asyncio.Queue = asyncio.Queue()
        handles = [RequestHandle(r, loop, events) for r in requests]
        with self._cv:
            if self.dead is not None:
                raise ApiError(503, ENGINE_DEAD)
            if not self._accepting:
                raise ApiError(503, "server is shutting down")
            if len(self._handles) + len(handles) > self.capacity:
                raise ApiError(429, f"server busy ({self.num_running} running and {self.queue_depth} queued); "
                                    "retry later", headers={"Retry-After": str(self.retry_after_s)})
            self._handles.update((h.request_id, h) for h in handles)
            self._new.extend(handles)
            self._gauges()
            self._cv.notify()
        return handles

    def cancel(self, request_id: str) -> None:
        """Drop a request: now if the engine has not got it yet, else at the next step."""
        with self._cv:
            h = self._handles.get(request_id)
            if h in self._new:
                self._new.remove(h)
                del self._handles[request_id]
                self._gauges()
            elif h is not None:
                self._cancels.add(request_id)
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
            while self._handles and self.dead is None and time.monotonic() < deadline:
                self._cv.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
            for rid, h in self._handles.items():
                h.post(StepOutput(rid, [], True, FINISH_ABORT))
            self._cancels.update(self._handles)
            self._new.clear()
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
                self._fail(list(self._handles), ApiError(503, ENGINE_DEAD))
                self._new.clear()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._stop or self._new or self._cancels or self._engine.has_unfinished()):
                    self._cv.wait()
                new, self._new = self._new, []
            for h in new:  # outside the lock; a cancel meanwhile lands in _cancels, applied below
                self._add(h)
            with self._cv:
                cancels, self._cancels = self._cancels, set()
                for rid in cancels:
                    self._handles.pop(rid, None)
            for rid in cancels:
                self._engine.abort(rid)
            if self._stop:
                return
            if self._engine.has_unfinished():
                self._step()
            with self._cv:
                self._gauges()
                self._cv.notify_all()
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
            error = ApiError(400, str(e))
        except Exception:
            log.error("add_request %s failed:\n%s", h.request_id, traceback.format_exc())
            error = ApiError(500, INTERNAL_ERROR)
        with self._cv:
            self._fail([h.request_id], error)

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            outputs = self._engine.step()
        except Exception:
            log.error("engine step failed:\n%s", traceback.format_exc())
            self._metrics.engine_errors.inc()
            old = self._engine
            with self._cv:
                self._fail(list(old.running), ApiError(500, INTERNAL_ERROR))
            self._engine = self._make_engine()
            for req in old.waiting.values():  # the queue goes on in the fresh engine
                self._engine.add_request(req)
            return
        self._metrics.step_seconds.observe(time.perf_counter() - t0)
        ratio = self._engine.stats.cost_ratio
        if ratio is not None and ratio == ratio:  # the policy predicted this step (NaN: nothing predicted)
            self._metrics.step_time_ratio.observe(ratio)
        for out in outputs:
            self._metrics.generation_tokens.inc(len(out.new_token_ids))
            with self._cv:
                handle = self._handles.pop(out.request_id, None) if out.finished else \
                    self._handles.get(out.request_id)
            if handle is not None:  # None: cancelled meanwhile
                handle.post(out)

    def _fail(self, request_ids: list[str], error: ApiError) -> None:
        """End these requests with `error` (under the lock)."""
        for rid in request_ids:
            h = self._handles.pop(rid, None)
            if h is not None:
                h.post(error)
        self._gauges()
        self._cv.notify_all()

    def _gauges(self) -> None:
        self._metrics.queue_depth.set(self.queue_depth)
        self._metrics.running.set(self.num_running)
