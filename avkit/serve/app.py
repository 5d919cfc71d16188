"""The HTTP application: routes, auth, OpenAI error envelopes, /health, /metrics, lifespan, and two ASGI layers
(docs/runtime.md, "Serving")."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from avkit.serve.completions import add_routes
from avkit.serve.metrics import CONTENT_TYPE
from avkit.serve.openai_api import INTERNAL_ERROR, ApiError
from avkit.serve.state import USAGE_KEY, ServeState

log = logging.getLogger("avkit.serve")
access_log = logging.getLogger("avkit.serve.access")

ENDPOINTS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"})


def _api_error(request: Request, e: Exception) -> ApiError:
    """Any exception a route raises -> the ApiError it answers with (a 500 says only that the log has it)."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, RequestValidationError):  # the first pydantic error: "field: problem, got value"
        err = e.errors()[0] if e.errors() else {"msg": "invalid request", "type": "missing"}
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        where, param, kind = ".".join(loc) or "body", loc[0] if loc else None, err.get("type")
        if kind == "json_invalid":
            return ApiError(400, f"request body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}")
        if kind == "extra_forbidden":
            return ApiError(400, f"unknown field {where!r}", param=param)
        if kind == "value_error":  # our own validators: the message already shows the value
            return ApiError(400, f"{where}: {err['msg'].removeprefix('Value error, ')}", param=param)
        got = "" if kind == "missing" else f", got {err.get('input')!r}"[:200]
        return ApiError(400, f"{where}: {err['msg']}{got}", param=param)
    if not isinstance(e, HTTPException):  # logged by ContainErrors, never echoed
        return ApiError(500, INTERNAL_ERROR)
    message = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed on {request.url.path}"
               }.get(e.status_code, "request body: cannot be parsed as UTF-8 JSON")  # 400: FastAPI cannot decode it
    return ApiError(e.status_code, message, headers=getattr(e, "headers", None))


async def _envelope(request: Request, e: Exception) -> JSONResponse:
    error = _api_error(request, e)
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def build_app(state: ServeState) -> FastAPI:
    """The FastAPI app around a ready `ServeState`; the lifespan starts and stops the engine loop."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine_loop.start()
        try:
            yield
        finally:
            state.begin_drain()
            waited = time.monotonic() - (state.drain_started or time.monotonic())
            grace = max(0.0, state.config.http.grace_period - waited)
            await asyncio.to_thread(state.engine_loop.shutdown, grace)
            try:
                await asyncio.to_thread(state.on_close)
            except Exception:  # on_close reports its own failures; this is the backstop
                log.exception("shutdown: closing the side writes failed")

    app = FastAPI(title="avkit", version="1", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.avkit = state
    for error in (ApiError, RequestValidationError, HTTPException, Exception):
        app.add_exception_handler(error, _envelope)
    key = state.config.http.api_key

    async def check_key(request: Request) -> None:  # `Authorization: Bearer KEY` when the server has an API key
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if key and (scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), key.encode())):
            raise ApiError(401, "missing or invalid API key (send `Authorization: Bearer KEY`)",
                           headers={"WWW-Authenticate": "Bearer"})

    auth = Depends(check_key)

    @app.get("/health")
    async def health():
        reasons = state.side_writes.reasons()
        if state.engine_loop.dead is not None:
            status, reasons = "failed", {"engine": f"engine thread died ({state.engine_loop.dead})"}
        elif state.drain_started is not None:
            status = "draining"
        elif not state.engine_loop.ready:
            status = "starting"
        else:
            status = "degraded" if reasons else "ok"
        body = {"status": status, "running": state.engine_loop.num_running, "queued": state.engine_loop.queue_depth}
        if reasons:
            body["reasons"] = reasons
        return JSONResponse(body, status_code=200 if status in ("ok", "degraded") else 503)

    @app.get("/v1/models", dependencies=[auth])
    async def models():
        return {"object": "list",
                "data": [{"id": state.model_name, "object": "model", "created": state.created, "owned_by": "avkit"}]}

    @app.get("/metrics", dependencies=[auth])
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    add_routes(app, state, auth)
    return app


async def send_error(send, error: ApiError) -> None:
    payload = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


class ContainErrors:
    """Outermost layer: an exception that escapes the app is logged once and swallowed (the keep-alive connection
    stays; before any byte was sent the client gets a 500 envelope); every response is counted on /metrics by
    endpoint (unknown paths: `other`, so scanning URLs cannot grow the label set) and status; --log-requests
    adds one access-log line per request (method, path, status, prompt and completion tokens, seconds)."""

    def __init__(self, app, metrics, log_requests: bool = False):
        self.app, self.metrics, self.log_requests = app, metrics, log_requests

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status, t0 = None, time.monotonic()

        async def track(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, track)
        except Exception:  # the one place an unexpected error stops
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if status is None:
                await send_error(track, ApiError(500, INTERNAL_ERROR))
        finally:
            status = 499 if status is None else status  # the app ended without an answer: the client left
            path = scope["path"] if scope["path"] in ENDPOINTS else "other"
            self.metrics.requests.labels(endpoint=path, status=str(status)).inc()
            if self.log_requests:
                prompt, completion = scope.get(USAGE_KEY, (0, 0))
                access_log.info("%s %s %d prompt_tokens=%d completion_tokens=%d %.3fs", scope["method"],
                                scope["path"], status, prompt, completion, time.monotonic() - t0)


class BodyLimit:
    """A body over `max_body_bytes` (by Content-Length, or counted in a chunked body) is a 413 envelope."""

    def __init__(self, app, max_body_bytes: int):
        self.app, self.max = app, max_body_bytes

    async def _too_large(self, send, got: str) -> None:
        await send_error(send, ApiError(413, f"request body: {got} bytes, over the limit of {self.max} "
                                             "(the server's --max-body-bytes)"))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max:
            return await self._too_large(send, declared.decode())
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nothing to answer
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max:
                return await self._too_large(send, f"more than {self.max}")
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:  # the app reads the whole body first, then waits for the disconnect
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def asgi_app(state: ServeState):
    """What uvicorn runs: the app inside its error/metrics/access-log and body-size layers."""
    cfg = state.config
    return ContainErrors(BodyLimit(build_app(state), cfg.http.max_body_bytes), state.metrics,
                         log_requests=cfg.http.log_requests)
