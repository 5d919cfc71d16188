"""`POST /v1/completions` and `POST /v1/chat/completions`: tokenize, admit, stream or collect.

One request flows: validate (protocol.py) -> token ids -> limits (context, max_tokens) ->
`EngineLoop.submit` (429 + Retry-After when full) -> engine events -> `TextStream` (detokenize,
stop sequences) -> SSE chunks or one JSON body. A client that disconnects, or a stop sequence
that matches, cancels the request in the engine at its next step.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from avkit.config import SamplingConfig
from avkit.errors import AvkitError
from avkit.runtime.request import Request as EngineRequest
from avkit.serve.app import ApiError, ServeState
from avkit.serve.engine_loop import NotAccepting, QueueFull, RequestHandle
from avkit.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    chat_body,
    chat_chunk,
    completion_body,
    new_id,
    usage,
)
from avkit.serve.text_stream import TextStream


class _SSEResponse(StreamingResponse):
    """SSE that also listens for the client going away, and always runs `on_close` at the end.

    Starlette (ASGI spec >= 2.4) only notices a disconnect on the next write; a request still
    waiting in the queue writes nothing, so this listens for `http.disconnect` as well.
    """

    def __init__(self, content: AsyncIterator[str], on_close):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            async with anyio.create_task_group() as tg:
                async def stream():
                    try:
                        await self.stream_response(send)
                    except OSError:  # client gone mid-write
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            self._on_close()


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


def _check_model(state: ServeState, model: str) -> None:
    if model != state.model_name:
        raise ApiError(404, f"model {model!r} not found; this server serves {state.model_name!r}",
                       param="model", type_="not_found_error")


def _prompt_ids(state: ServeState, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        ids = state.tokenizer.encode(prompt)
    else:
        bad = [t for t in prompt if not 0 <= t < state.vocab_size]
        if bad:
            raise ApiError(400, f"prompt: token id {bad[0]} outside the vocabulary [0, {state.vocab_size})",
                           param="prompt")
        ids = list(prompt)
    if not ids:
        raise ApiError(400, "prompt: encodes to no tokens", param="prompt")
    return ids


def _max_tokens(state: ServeState, prompt_len: int, requested: int | None, param: str,
                prompt_param: str) -> int:
    """Check the prompt against the context and max_tokens against the limits; chat may leave it unset."""
    limit, cfg = state.context_limit, state.config
    if prompt_len >= limit:
        raise ApiError(400, f"{prompt_param}: {prompt_len} tokens, over the context limit of {limit} "
                            f"(max_len {cfg.max_len} minus {cfg.k + 1} draft slots)", param=prompt_param)
    if requested is None:
        return min(cfg.default_max_tokens, limit - prompt_len)
    if requested > cfg.max_tokens_limit:
        raise ApiError(400, f"{param}: must be <= {cfg.max_tokens_limit}, got {requested}", param=param)
    if prompt_len + requested > limit:
        raise ApiError(400, f"{param}: {requested} + {prompt_len} prompt tokens exceeds the context limit "
                            f"of {limit}", param=param)
    return requested


@dataclass(frozen=True)
class SeededRequest(EngineRequest):
    """An engine request whose RNG key is fixed, so `seed` reproduces a completion across requests.

    The engine keys its random numbers by (seed, request key, position) and derives the key from
    the (unique) request id; OpenAI's `seed` promises the same output for the same request, so a
    seeded request uses key 0 instead: equal seed, prompt and parameters -> equal tokens. Best effort,
    as OpenAI's: under adaptive verification the verified prefix depends on the rest of the batch and
    the draft gate on the traffic served before, so load can change a seeded sample (never its
    distribution); the `full` and `fixed` policies reproduce it exactly.
    """

    @property
    def key(self) -> int:
        return 0


def _submit(state: ServeState, rid: str, prompt_ids: list[int], body, max_tokens: int) -> RequestHandle:
    try:
        sampling = SamplingConfig(temperature=body.temperature, top_p=body.top_p,
                                  max_new_tokens=max_tokens, seed=body.seed)
        make = EngineRequest if body.seed is None else SeededRequest
        req = make(rid, prompt_ids, sampling, dataset="serve")
    except AvkitError as e:
        raise ApiError(400, str(e)) from None
    try:
        handle = state.engine_loop.submit(req, asyncio.get_running_loop())
    except QueueFull as e:
        raise ApiError(429, f"server busy ({e}); retry later", type_="rate_limit_error",
                       headers={"Retry-After": str(state.config.retry_after_s)}) from None
    except NotAccepting:
        raise ApiError(503, "server is shutting down", type_="unavailable_error") from None
    state.metrics.prompt_tokens.inc(len(prompt_ids))
    return handle


class _Failed(Exception):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


async def _text_events(state: ServeState, handle: RequestHandle, ts: TextStream):
    """Engine events -> (text delta, finish_reason or None); finish_reason set on the last one."""
    t0, first = time.monotonic(), True
    while True:
        ev = await handle.events.get()
        if ev.error is not None:
            raise _Failed(ev.error, ev.status)
        delta = ts.push(ev.new_token_ids)
        if first and ev.new_token_ids:
            state.metrics.ttft_seconds.observe(time.monotonic() - t0)
            first = False
        if ts.stopped or ev.finished:
            if ts.stopped and not ev.finished:
                state.engine_loop.cancel(handle.request_id)
            state.metrics.latency_seconds.observe(time.monotonic() - t0)
            yield delta + ts.finish(), "stop" if ts.stopped else (ev.finish_reason or "stop")
            return
        if delta:
            yield delta, None


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(state: ServeState, handle: RequestHandle, ts: TextStream, request: Request):
    """Run a non-streamed request to the end; None when the client disconnected first."""
    async def drain():
        parts, finish = [], None
        async for delta, finish in _text_events(state, handle, ts):  # noqa: B007 (finish: the last one)
            parts.append(delta)
        return "".join(parts), finish

    work = asyncio.ensure_future(drain())
    gone = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
            state.engine_loop.cancel(handle.request_id)
    if not work.done() or work.cancelled():
        return None
    try:
        return work.result()
    except _Failed as e:
        raise ApiError(e.status, str(e), type_="internal_error" if e.status >= 500 else
                       "invalid_request_error") from None


async def _stream(state, handle, ts, rid, chat: bool, include_usage: bool, prompt_len: int):
    model = state.model_name
    if chat:
        yield _sse(chat_chunk(rid, model, {"role": "assistant", "content": ""}, None))
    try:
        async for delta, finish in _text_events(state, handle, ts):
            if chat:
                yield _sse(chat_chunk(rid, model, {"content": delta} if delta else {}, finish))
            else:
                yield _sse(completion_body(rid, model, delta, finish, None, chunk=True))
    except _Failed as e:  # headers are sent: report the error in-band, as OpenAI does
        yield _sse({"error": {"message": str(e), "type": "internal_error", "code": e.status}})
        return
    if include_usage:
        use = usage(prompt_len, ts.num_tokens)
        yield _sse(chat_chunk(rid, model, {}, None, use) if chat else
                   {**completion_body(rid, model, "", None, use, chunk=True), "choices": []})
    yield _sse("[DONE]")


async def _respond(state: ServeState, request: Request, body, prompt_ids: list[int],
                   max_tokens: int, chat: bool):
    rid = new_id("chatcmpl" if chat else "cmpl")
    handle = _submit(state, rid, prompt_ids, body, max_tokens)
    decode = functools.partial(state.tokenizer.decode, skip_special_tokens=True)
    ts = TextStream(decode, body.stop or ())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _SSEResponse(_stream(state, handle, ts, rid, chat, include_usage, len(prompt_ids)),
                            on_close=lambda: state.engine_loop.cancel(rid))
    result = await _collect(state, handle, ts, request)
    if result is None:  # client gone; nobody reads this
        return JSONResponse({}, status_code=499)
    text, finish = result
    use = usage(len(prompt_ids), ts.num_tokens)
    make = chat_body if chat else completion_body
    return make(rid, state.model_name, text, finish, use)


def add_routes(app: FastAPI, state: ServeState, auth) -> None:
    @app.post("/v1/completions", dependencies=[auth])
    async def completions(body: CompletionRequest, request: Request):
        _check_model(state, body.model)
        ids = _prompt_ids(state, body.prompt)
        max_tokens = _max_tokens(state, len(ids), body.max_tokens, "max_tokens", "prompt")
        return await _respond(state, request, body, ids, max_tokens, chat=False)

    @app.post("/v1/chat/completions", dependencies=[auth])
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _check_model(state, body.model)
        messages = [m.as_template_dict() for m in body.messages]
        try:
            ids = state.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=body.tools)
        except Exception as e:
            raise ApiError(400, f"messages: chat template failed: {e}", param="messages") from None
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        requested = body.max_completion_tokens or body.max_tokens
        max_tokens = _max_tokens(state, len(ids), requested, param, "messages")
        return await _respond(state, request, body, list(ids), max_tokens, chat=True)
