"""What goes into the engine (Request), what comes out (StepOutput per step, Generation at the end), and the
host bookkeeping in between. Torch-free: `avkit record` builds requests before the engine loads.

A request's random numbers are keyed by (seed, request key, position), the key a hash of the request id (or
`rng_key`): a seeded request samples the same tokens whatever else shares its batch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from avkit.config import SamplingConfig
from avkit.errors import ConfigError

FINISH_STOP = "stop"  # EOS or a stop token was emitted
FINISH_LENGTH = "length"  # max_new_tokens reached, or the context (max_len) is full
FINISH_ABORT = "abort"  # aborted by the caller


@dataclass(frozen=True)
class Request:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    dataset: str = ""
    stop_token_ids: tuple[int, ...] = ()  # finish at these as well as at the tokenizer's EOS ids
    rng_key: int | None = None  # fixed RNG key (serve's OpenAI `seed`: the choice index); None: hash of request_id

    def __post_init__(self):
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ConfigError(f"request_id must be a non-empty string, got {self.request_id!r}")
        if len(self.prompt_ids) == 0:
            raise ConfigError(f"request {self.request_id!r}: prompt_ids is empty")
        if not isinstance(self.sampling, SamplingConfig):
            raise ConfigError(f"request {self.request_id!r}: sampling must be a SamplingConfig, "
                              f"got {type(self.sampling).__name__}")

    @property
    def key(self) -> int:
        """The request's key for the counter-based RNG: `rng_key`, else a stable 31-bit hash of request_id."""
        if self.rng_key is not None:
            return self.rng_key
        return int.from_bytes(hashlib.blake2b(self.request_id.encode(), digest_size=4).digest(), "little") >> 1


@dataclass(frozen=True)
class StepOutput:
    request_id: str
    new_token_ids: list[int]  # tokens emitted this step (after stop truncation)
    finished: bool
    finish_reason: str | None  # FINISH_STOP, FINISH_LENGTH, FINISH_ABORT or None while running


@dataclass(frozen=True)
class Generation:
    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    dataset: str = ""
    num_steps: int = 0  # engine steps this request took part in (decode steps)


@dataclass
class RunningSeq:
    """A running request: its sequence and bookkeeping (all on the host; the step reads lengths here)."""

    req: Request
    slot: int
    tokens: list[int]  # prompt + output
    seed: int
    key: int
    steps: int = 0

    @property
    def num_output(self) -> int:
        return len(self.tokens) - len(self.req.prompt_ids)


@dataclass
class EngineStats:
    """Cumulative wall time, for benchmarks: `overhead_share` is the share outside the model forwards."""

    steps: int = 0
    tokens: int = 0
    step_s: float = 0.0
    target_forward_s: float = 0.0
    draft_forward_s: float = 0.0
    cost_ratio: float | None = None  # the last step's actual / predicted ms (a policy that predicts it), or None

    @property
    def overhead_share(self) -> float:
        """Share of step time outside the model forwards."""
        fwd = self.target_forward_s + self.draft_forward_s
        return 0.0 if self.step_s == 0 else max(0.0, 1.0 - fwd / self.step_s)
