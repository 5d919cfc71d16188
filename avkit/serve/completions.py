"""`POST /v1/completions` and `POST /v1/chat/completions`: tokenize, admit, stream or collect.

One request flows: validate (openai_api.py) -> token ids (tokenizer and chat template run in a
worker thread: the tokenizer releases the GIL, so a multi-MB prompt never stalls /health) ->
limits (context, max_tokens, n) -> `Generation` (n engine requests; 429 + Retry-After when full)
-> engine events -> `TextStream` (detokenize, stop sequences) -> SSE chunks or one JSON body. A
client that disconnects, or a stop sequence that matches, cancels the request in the engine at
its next step.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from avkit.serve.generation import Generation
from avkit.serve.middleware import USAGE_KEY
from avkit.serve.openai_api import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    response_body,
    usage,
)
from avkit.serve.state import ServeState

_SURROGATE = re.compile("[\ud800-\udfff]")


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
                       param="model")


def _check_text(text: str, param: str) -> None:
    """JSON may carry a lone UTF-16 surrogate (\\ud800) that no tokenizer can encode: a 400, not a 500."""
    bad = _SURROGATE.search(text)
    if bad:
        raise ApiError(400, f"{param}: lone surrogate {bad.group()!r} at character {bad.start()} is not valid "
                            "Unicode text", param=param)


async def _prompt_ids(state: ServeState, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        _check_text(prompt, "prompt")
        ids = await anyio.to_thread.run_sync(state.tokenizer.encode, prompt)  # off the event loop
    else:
        bad = [t for t in prompt if not 0 <= t < state.vocab_size]
        if bad:
            raise ApiError(400, f"prompt: token id {bad[0]} outside the vocabulary [0, {state.vocab_size})",
                           param="prompt")
        ids = list(prompt)
    if not ids:
        raise ApiError(400, "prompt: encodes to no tokens", param="prompt")
    return ids


async def _chat_ids(state: ServeState, body: ChatCompletionRequest) -> list[int]:
    messages = [m.as_template_dict() for m in body.messages]
    for i, m in enumerate(messages):
        _check_text(m["content"], f"messages.{i}.content")
    try:  # jinja2 rendering and tokenization off the event loop
        ids = await anyio.to_thread.run_sync(
            lambda: state.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=body.tools))
    except Exception as e:  # a template that cannot render these messages is the client's 400
        raise ApiError(400, f"messages: the chat template cannot render them ({type(e).__name__}: "
                            f"{str(e)[:200]})", param="messages") from None
    return list(ids)


def _max_tokens(state: ServeState, prompt_len: int, requested: int | None, param: str,
                prompt_param: str) -> int:
    """Check the prompt against the context and max_tokens against the limits; chat may leave it unset."""
    limit, cfg = state.context_limit, state.config
    if prompt_len >= limit:
        raise ApiError(400, f"{prompt_param}: {prompt_len} tokens, over the context limit of {limit} "
                            f"(max_len {cfg.engine.max_len} minus {cfg.engine.k + 1} draft slots)", param=prompt_param)
    if requested is None:
        return min(cfg.default_max_tokens, limit - prompt_len)
    if requested > cfg.max_new_tokens:
        raise ApiError(400, f"{param}: must be <= {cfg.max_new_tokens}, got {requested}", param=param)
    if prompt_len + requested > limit:
        raise ApiError(400, f"{param}: {requested} + {prompt_len} prompt tokens exceeds the context limit "
                            f"of {limit}", param=param)
    return requested


async def _collect(gen: Generation, request: Request) -> list[tuple[str, str]] | None:
    """Run a non-streamed request to the end; None when the client disconnected first."""
    work = asyncio.ensure_future(gen.collect())
    gone = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
            gen.cancel()
    return None if not work.done() or work.cancelled() else work.result()  # an error event raises its ApiError


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _stream(gen: Generation, request: Request, chat: bool, include_usage: bool):
    def chunk(choices, use=None, index=0):
        return _sse(response_body(gen.rid, gen.state.model_name, chat, choices, use, chunk=True, index=index))

    if chat:
        for c in gen.choices:
            yield chunk([({"role": "assistant", "content": ""}, None)], index=c.index)
    try:
        async for i, delta, finish in gen.events():
            yield chunk([(({"content": delta} if delta else {}) if chat else delta, finish)], index=i)
    except ApiError as e:  # headers are sent: report the error in-band, as OpenAI does
        gen.cancel()
        yield _sse(e.body())
        return
    finally:
        request.scope[USAGE_KEY] = (gen.prompt_len, gen.completion_tokens)
    if include_usage:
        yield chunk([], usage(gen.prompt_len, gen.completion_tokens))
    yield _sse("[DONE]")


async def _respond(state: ServeState, request: Request, body, prompt_ids: list[int],
                   max_tokens: int, chat: bool):
    if body.n > state.config.engine.concurrency:
        raise ApiError(400, f"n: must be <= {state.config.engine.concurrency} (the server's --concurrency), "
                            f"got {body.n}", param="n")
    gen = Generation(state, f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", prompt_ids, body, max_tokens)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _SSEResponse(_stream(gen, request, chat, include_usage), on_close=gen.cancel)
    choices = await _collect(gen, request)
    request.scope[USAGE_KEY] = (gen.prompt_len, gen.completion_tokens)
    if choices is None:  # client gone; nobody reads this
        return JSONResponse({}, status_code=499)
    return response_body(gen.rid, state.model_name, chat, choices, usage(gen.prompt_len, gen.completion_tokens))


def add_routes(app: FastAPI, state: ServeState, auth) -> None:
    @app.post("/v1/completions", dependencies=[auth])
    async def completions(body: CompletionRequest, request: Request):
        _check_model(state, body.model)
        ids = await _prompt_ids(state, body.prompt)
        max_tokens = _max_tokens(state, len(ids), body.max_tokens, "max_tokens", "prompt")
        return await _respond(state, request, body, ids, max_tokens, chat=False)

    @app.post("/v1/chat/completions", dependencies=[auth])
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _check_model(state, body.model)
        ids = await _chat_ids(state, body)
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        requested = body.max_completion_tokens or body.max_tokens
        max_tokens = _max_tokens(state, len(ids), requested, param, "messages")
        return await _respond(state, request, body, ids, max_tokens, chat=True)
