"""One HTTP request in the engine: its `n` choices, each an engine request, and their text events.

A request with `n` choices submits n engine requests at once (all admitted or none: a 429 never
leaves half a request decoding) with ids `<rid>-<i>`; each choice has its own `TextStream`.
Every choice is an independent sample of the same distribution, so `n > 1` is lossless for the
same reason n = 1 is. With `seed`, choice i uses RNG key i: equal seed, prompt and parameters give
equal choices, and the n choices of one request differ from each other.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from avkit.config import SamplingConfig
from avkit.errors import AvkitError
from avkit.runtime.request import Request as EngineRequest
from avkit.serve.engine_loop import RequestHandle
from avkit.serve.openai_api import ApiError
from avkit.serve.state import ServeState
from avkit.serve.text_stream import TextStream


@dataclass
class Choice:
    index: int
    handle: RequestHandle
    text: TextStream


class Generation:
    """The n choices of one request, submitted together; `events()` merges their text deltas."""

    def __init__(self, state: ServeState, rid: str, prompt_ids: list[int], body, max_tokens: int):
        self.state, self.rid, self.prompt_len = state, rid, len(prompt_ids)
        try:
            sampling = SamplingConfig(temperature=body.temperature, top_p=body.top_p, max_new_tokens=max_tokens,
                                      seed=body.seed, top_k=max(0, body.top_k or 0), min_p=body.min_p or 0.0)
            # OpenAI's `seed` promises the same output for the same request, so a seeded choice i uses RNG key i
            # instead of its (unique) id's hash. Best effort, as OpenAI's: under adaptive verification the
            # verified prefix depends on the rest of the batch and the draft gate on the traffic served
            # before, so load can change a seeded sample (never its distribution); `full` and `fixed` do not.
            requests = [EngineRequest(f"{rid}-{i}", prompt_ids, sampling, dataset="serve",
                                      rng_key=i if body.seed is not None else None) for i in range(body.n)]
        except AvkitError as e:
            raise ApiError(400, str(e)) from None
        handles = state.engine_loop.submit_all(requests, asyncio.get_running_loop())  # or a 429 / 503 ApiError
        state.metrics.prompt_tokens.inc(len(prompt_ids))
        decode = functools.partial(state.tokenizer.decode, skip_special_tokens=True)
        self.choices = [Choice(i, h, TextStream(decode, body.stop or ())) for i, h in enumerate(handles)]
        self.t0 = time.monotonic()

    @property
    def completion_tokens(self) -> int:
        return sum(c.text.num_tokens for c in self.choices)

    def cancel(self) -> None:
        for c in self.choices:
            self.state.engine_loop.cancel(c.handle.request_id)

    async def _choice_events(self, choice: Choice) -> AsyncIterator[tuple[str, str | None]]:
        """Engine events of one choice -> (text delta, finish_reason or None); finish set on the last."""
        state, ts, first = self.state, choice.text, True
        while True:
            ev = await choice.handle.events.get()
            if ev.error is not None:
                raise ev.error
            delta = ts.push(ev.new_token_ids)
            if first and ev.new_token_ids:
                state.metrics.ttft_seconds.observe(time.monotonic() - self.t0)
                first = False
            if ts.stopped or ev.finished:
                if ts.stopped and not ev.finished:
                    state.engine_loop.cancel(choice.handle.request_id)
                state.metrics.latency_seconds.observe(time.monotonic() - self.t0)
                yield delta + ts.finish(), "stop" if ts.stopped else (ev.finish_reason or "stop")
                return
            if delta:
                yield delta, None

    async def events(self) -> AsyncIterator[tuple[int, str, str | None]]:
        """(choice index, text delta, finish_reason or None) of every choice as they come."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(choice: Choice) -> None:
            try:
                async for delta, finish in self._choice_events(choice):
                    queue.put_nowait((choice.index, delta, finish))
            except ApiError as e:
                queue.put_nowait(e)

        tasks = [asyncio.ensure_future(pump(c)) for c in self.choices]
        try:
            for _ in range(len(self.choices)):
                while True:
                    item = await queue.get()
                    if isinstance(item, ApiError):
                        raise item
                    yield item
                    if item[2] is not None:
                        break
        finally:
            for t in tasks:
                t.cancel()

    async def collect(self) -> list[tuple[str, str]]:
        """Run every choice to the end -> [(text, finish_reason)] by choice index."""
        parts: list[list[str]] = [[] for _ in self.choices]
        finish: list[str] = ["stop"] * len(self.choices)
        async for i, delta, reason in self.events():
            parts[i].append(delta)
            if reason is not None:
                finish[i] = reason
        return [("".join(p), f) for p, f in zip(parts, finish)]
