"""What every route shares: `ServeState`, and the scope key of token usage (`USAGE_KEY`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from avkit.config import ServeConfig
from avkit.serve.engine_loop import EngineLoop
from avkit.serve.metrics import ServeMetrics
from avkit.serve.side_writes import SideWrites

USAGE_KEY = "avkit.usage"  # ASGI scope key the generation endpoints set to (prompt, completion) tokens


@dataclass
class ServeState:
    """What the routes need: config, the engine loop, the tokenizer, metrics, and a close hook."""

    config: ServeConfig
    engine_loop: EngineLoop
    tokenizer: Any  # avkit.models tokenizer: encode, decode, apply_chat_template
    vocab_size: int
    model_name: str
    metrics: ServeMetrics
    on_close: Callable[[], None] = lambda: None  # snapshot coefficients, flush the trace
    make_engine: Callable[[], Any] | None = None  # a fresh engine as the server builds it (tests)
    side_writes: SideWrites = field(default_factory=SideWrites)  # snapshot / trace failures -> degraded
    startup: str = ""  # the block logged at start: what this server runs
    created: int = field(default_factory=lambda: int(time.time()))
    drain_started: float | None = None  # monotonic time the shutdown began

    @property
    def context_limit(self) -> int:
        """Prompt + completion tokens a request may use: the KV cache keeps K + 1 verify slots free."""
        return self.config.engine.max_len - self.config.engine.k - 1

    def begin_drain(self) -> None:
        if self.drain_started is None:
            self.drain_started = time.monotonic()
        self.engine_loop.begin_drain()
