"""`POST /v1/completions` and `POST /v1/chat/completions`: tokenize, admit, stream or collect; token ids -> text
deltas with stop sequences (docs/runtime.md, "Serving": a generation, its n choices and seeds; the prefix window
and held-back text)."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from avkit.config import SamplingConfig
from avkit.runtime.request import Request as EngineRequest
from avkit.serve.openai_api import ApiError, ChatCompletionRequest, CompletionRequest, response_body, usage
from avkit.serve.state import USAGE_KEY, ServeState

_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


class TextStream:
    """Feed token ids as they arrive; get the text that is safe to emit."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()):
        self._decode = decode
        self._stop = list(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1  # chars that may start a stop
        self._ids: list[int] = []
        self._prefix_offset = 0  # first id of the decode window
        self._read_offset = 0  # ids before this are already turned into text
        self.text = ""  # all text decoded so far (after stop truncation)
        self._emitted = 0  # len of text already returned by push()
        self.stopped = False  # a stop sequence was found; the caller cancels the request

    @property
    def num_tokens(self) -> int:
        return len(self._ids)

    def push(self, new_ids: Sequence[int]) -> str:
        """Add generated ids; return the new text that can be emitted now ('' if none)."""
        if self.stopped or not new_ids:
            return ""
        self._ids.extend(int(t) for t in new_ids)
        self._decode_new(final=False)
        return self._take(final=False)

    def finish(self) -> str:
        """The request ended: flush held-back text (an incomplete character decodes as U+FFFD)."""
        if not self.stopped:
            self._decode_new(final=True)
        return self._take(final=True)

    def _decode_new(self, final: bool) -> None:
        """Text of the ids after the read offset, decoded with the prefix window; an incomplete character
        waits for more ids unless `final`."""
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full = self._decode(self._ids[self._prefix_offset:])
        if final or (len(full) > len(prefix) and not full.endswith(REPLACEMENT)):
            self._append(full[len(prefix):])
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)

    def _append(self, delta: str) -> None:
        start = max(0, len(self.text) - self._hold)  # a stop may straddle old and new text
        self.text += delta
        hits = [i for i in (self.text.find(s, start) for s in self._stop) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True

    def _take(self, final: bool) -> str:
        end = len(self.text) if (final or self.stopped) else max(self._emitted,
                                                                  len(self.text) - self._hold)
        out = self.text[self._emitted:end]
        self._emitted = end
        return out


class Generation:
    """The n choices of one request (module doc); `events()` turns their engine events into text deltas."""

    def __init__(self, state: ServeState, rid: str, prompt_ids: list[int], body, max_tokens: int):
        self.state, self.rid, self.prompt_len = state, rid, len(prompt_ids)
        # the request body's bounds (openai_api.py) are SamplingConfig's or tighter: nothing here can refuse it
        sampling = SamplingConfig(temperature=body.temperature, top_p=body.top_p, max_new_tokens=max_tokens,
                                  seed=body.seed, top_k=max(0, body.top_k or 0), min_p=body.min_p or 0.0)
        requests = [EngineRequest(f"{rid}-{i}", prompt_ids, sampling, dataset="serve",
                                  rng_key=i if body.seed is not None else None) for i in range(body.n)]
        self.handles = state.engine_loop.submit_all(requests, asyncio.get_running_loop())  # or a 429 / 503
        state.metrics.prompt_tokens.inc(len(prompt_ids))
        decode = functools.partial(state.tokenizer.decode, skip_special_tokens=True)
        self.texts = {h.request_id: TextStream(decode, body.stop or ()) for h in self.handles}  # one per choice
        self.t0 = time.monotonic()

    @property
    def completion_tokens(self) -> int:
        return sum(ts.num_tokens for ts in self.texts.values())

    def cancel(self) -> None:
        for h in self.handles:
            self.state.engine_loop.cancel(h.request_id)

    async def events(self) -> AsyncIterator[tuple[int, str, str | None]]:
        """(choice index, text delta, finish_reason or None) of every choice as they come; finish set on a
        choice's last. A choice that matched a stop sequence is cancelled in the engine; its later events drop."""
        index, metrics = {rid: i for i, rid in enumerate(self.texts)}, self.state.metrics
        live = set(index)
        while live:
            ev = await self.handles[0].events.get()
            if isinstance(ev, ApiError):
                raise ev
            if ev.request_id not in live:
                continue
            ts = self.texts[ev.request_id]
            if ts.num_tokens == 0 and ev.new_token_ids:
                metrics.ttft_seconds.observe(time.monotonic() - self.t0)
            delta = ts.push(ev.new_token_ids)
            if ts.stopped or ev.finished:
                if not ev.finished:
                    self.state.engine_loop.cancel(ev.request_id)
                metrics.latency_seconds.observe(time.monotonic() - self.t0)
                live.discard(ev.request_id)
                yield index[ev.request_id], delta + ts.finish(), "stop" if ts.stopped else (ev.finish_reason or "stop")
            elif delta:
                yield index[ev.request_id], delta, None

    async def collect(self) -> list[tuple[str, str]]:
        """Run every choice to the end -> [(text, finish_reason)] by choice index."""
        parts, finish = [[] for _ in self.handles], ["stop"] * len(self.handles)
        async for i, delta, reason in self.events():
            parts[i].append(delta)
            finish[i] = reason or finish[i]
        return [("".join(p), f) for p, f in zip(parts, finish)]


class _Reply(Response):
    """Runs `produce(send)` (the SSE stream, or one JSON body once every choice is done) while listening for the
    client's disconnect itself: Starlette notices one only at the next write, and a request waiting in the queue
    writes nothing. `on_close` (cancel the request in the engine) always runs at the end; a client gone before
    any answer is counted 499 (app.py)."""

    def __init__(self, produce, on_close):
        super().__init__()
        self._produce, self._on_close = produce, on_close

    async def __call__(self, scope, receive, send):
        try:
            async with anyio.create_task_group() as tg:
                async def run():
                    try:
                        await self._produce(send)
                    except OSError:  # client gone mid-write
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(run)
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()
        finally:
            self._on_close()


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


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


async def _stream(gen: Generation, request: Request, chat: bool, include_usage: bool):
    def chunk(choices, use=None, index=0):
        return _sse(response_body(gen.rid, gen.state.model_name, chat, choices, use, chunk=True, index=index))

    if chat:
        for i in range(len(gen.handles)):
            yield chunk([({"role": "assistant", "content": ""}, None)], index=i)
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


async def _respond(state: ServeState, request: Request, body, chat: bool):
    """Check the request against this server (model, prompt, limits), then stream or collect its generation."""
    if body.model != state.model_name:
        raise ApiError(404, f"model {body.model!r} not found; this server serves {state.model_name!r}",
                       param="model")
    if chat:
        prompt_ids = await _chat_ids(state, body)
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        max_tokens = _max_tokens(state, len(prompt_ids), body.max_completion_tokens or body.max_tokens, param,
                                 "messages")
    else:
        prompt_ids = await _prompt_ids(state, body.prompt)
        max_tokens = _max_tokens(state, len(prompt_ids), body.max_tokens, "max_tokens", "prompt")
    if body.n > state.config.engine.concurrency:
        raise ApiError(400, f"n: must be <= {state.config.engine.concurrency} (the server's --concurrency), "
                            f"got {body.n}", param="n")
    gen = Generation(state, f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", prompt_ids, body, max_tokens)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        sse = StreamingResponse(_stream(gen, request, chat, include_usage), media_type="text/event-stream",
                                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return _Reply(sse.stream_response, gen.cancel)

    async def reply(send) -> None:
        try:
            choices = await gen.collect()
            response = JSONResponse(response_body(gen.rid, state.model_name, chat, choices,
                                                  usage(gen.prompt_len, gen.completion_tokens)))
        except ApiError as e:  # an error event: its own status and envelope
            response = JSONResponse(e.body(), status_code=e.status, headers=e.headers)
        request.scope[USAGE_KEY] = (gen.prompt_len, gen.completion_tokens)
        await response(request.scope, request.receive, send)

    return _Reply(reply, gen.cancel)


def add_routes(app: FastAPI, state: ServeState, auth) -> None:
    @app.post("/v1/completions", dependencies=[auth])
    async def completions(body: CompletionRequest, request: Request):
        return await _respond(state, request, body, chat=False)

    @app.post("/v1/chat/completions", dependencies=[auth])
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await _respond(state, request, body, chat=True)
