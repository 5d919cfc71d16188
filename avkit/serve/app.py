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
from avkit.serve.middleware import INTERNAL_ERROR_BODY, BodyLimit, ContainErrors, CountRequests
from avkit.serve.openai_api import error_body, model_list
from avkit.serve.state import ApiError, ServeState


def _validation_message(err: dict) -> tuple[str, str | None]:
    """First pydantic error -> ("field: problem, got value", top-level field)."""
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    if err.get("type") == "json_invalid":
        return f"request body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}", None
    if err.get("type") == "extra_forbidden":
        return f"unknown field {'.'.join(loc)!r}", loc[0] if loc else None
    where = ".".join(loc) or "body"
    if err.get("type") == "value_error":  # our own validators: the message already shows the value
        return f"{where}: {err['msg'].removeprefix('Value error, ')}", loc[0] if loc else None
    got = err.get("input")
    got_s = "" if err.get("type") == "missing" else f", got {got!r}"[:200]
    return f"{where}: {err['msg']}{got_s}", loc[0] if loc else None


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return JSONResponse(error_body(e.message, type_=e.type_, param=e.param, code=e.status),
                            status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError):
        errors = e.errors()
        message, param = _validation_message(errors[0]) if errors else ("invalid request", None)
        return JSONResponse(error_body(message, param=param, code=400), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException):
        if e.status_code == 404:
            message, type_ = f"no route {request.url.path}", "not_found_error"
        elif e.status_code == 405:
            message, type_ = f"method {request.method} not allowed on {request.url.path}", "invalid_request_error"
        else:  # 400: a body FastAPI cannot decode (invalid UTF-8 among them)
            message, type_ = "request body: cannot be parsed as UTF-8 JSON", "invalid_request_error"
        return JSONResponse(error_body(message, type_=type_, code=e.status_code), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):  # logged by ContainErrors, never echoed
        return JSONResponse(INTERNAL_ERROR_BODY, status_code=500)


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
                           type_="authentication_error", headers={"WWW-Authenticate": "Bearer"})

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
    _install_error_handlers(app)
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
        return model_list(state.model_name, state.created)

    @app.get("/metrics", dependencies=[auth])
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    add_routes(app, state, auth)
    return app


def asgi_app(state: ServeState):
    """What uvicorn runs: the app inside its error, metrics/access-log and body-size layers."""
    cfg = state.config
    return ContainErrors(CountRequests(BodyLimit(build_app(state), cfg.http.max_body_bytes), state.metrics,
                                       log_requests=cfg.http.log_requests))
