"""The FastAPI application: OpenAI routes, auth, error envelopes, metrics, lifespan.

Handlers never touch the engine: generation endpoints (`avkit.serve.completions`) submit to the
`EngineLoop` and stream its events. Every error, including FastAPI's own validation errors, 404,
405 and unparsable bodies, is returned in OpenAI's envelope `{"error": {"message", "type",
"param", "code"}}` with a message that names the field and the bad value; a 500 says only that
the log has the details. `asgi_app` wraps the app in the layers of `avkit.serve.middleware`.
/health: 200 `ok` or `degraded` (a side write is failing; `reasons` says which and why), 503
`starting` (the warm-up has not run yet), `draining` (shutting down) or `failed` (the engine thread died).
"""

from __future__ import annotations

import asyncio
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
from avkit.serve.middleware import BodyLimit, ContainErrors
from avkit.serve.openai_api import INTERNAL_ERROR, ApiError
from avkit.serve.state import ServeState


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


def _auth(state: ServeState):
    """A dependency: `Authorization: Bearer KEY` when the server has an API key."""
    key = state.config.http.api_key

    async def check(request: Request) -> None:
        if not key:
            return
        got = request.headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(401, "missing or invalid API key (send `Authorization: Bearer KEY`)",
                           headers={"WWW-Authenticate": "Bearer"})

    return check


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
                logging.getLogger("avkit.serve").exception("shutdown: closing the side writes failed")

    app = FastAPI(title="avkit", version="1", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.avkit = state
    for error in (ApiError, RequestValidationError, HTTPException, Exception):
        app.add_exception_handler(error, _envelope)
    auth = Depends(_auth(state))

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


def asgi_app(state: ServeState):
    """What uvicorn runs: the app inside its error/metrics/access-log and body-size layers."""
    cfg = state.config
    return ContainErrors(BodyLimit(build_app(state), cfg.http.max_body_bytes), state.metrics,
                         log_requests=cfg.http.log_requests)
