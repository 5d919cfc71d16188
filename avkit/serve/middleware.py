"""ASGI layers around the FastAPI app, outermost first: contain errors and count, cap the body.

  ContainErrors   an exception that escapes the app (FastAPI's ServerErrorMiddleware re-raises after
                  sending the 500) ends here: logged once with its traceback and swallowed, so the
                  server keeps the keep-alive connection instead of resetting it; if nothing was sent
                  yet, the client gets a 500 in the OpenAI envelope with no exception text. Every
                  response is counted by endpoint and status on /metrics (streams included); with
                  --log-requests one access-log line per request: method, path, status, prompt and
                  completion tokens, seconds
  BodyLimit       reads a request body up to `max_body_bytes` before the app sees it; more (by
                  Content-Length, or by counting a chunked body) is a 413 in the envelope
"""

from __future__ import annotations

import json
import logging
import time

from avkit.serve.openai_api import INTERNAL_ERROR, ApiError

log = logging.getLogger("avkit.serve")
access_log = logging.getLogger("avkit.serve.access")

ENDPOINTS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"})
USAGE_KEY = "avkit.usage"  # scope key the generation endpoints set to (prompt, completion) tokens


async def send_error(send, error: ApiError) -> None:
    payload = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


class ContainErrors:
    """Unknown paths share the label `other`, so scanning random URLs cannot grow the label set."""

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
            status = 500 if status is None else status  # the app ended before answering
            path = scope["path"] if scope["path"] in ENDPOINTS else "other"
            self.metrics.requests.labels(endpoint=path, status=str(status)).inc()
            if self.log_requests:
                prompt, completion = scope.get(USAGE_KEY, (0, 0))
                access_log.info("%s %s %d prompt_tokens=%d completion_tokens=%d %.3fs", scope["method"],
                                scope["path"], status, prompt, completion, time.monotonic() - t0)


class BodyLimit:
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
