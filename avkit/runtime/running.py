"""The engine's host bookkeeping: running sequences and cumulative timings."""

from __future__ import annotations

from dataclasses import dataclass

from avkit.runtime.request import Request


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
    """Cumulative wall time, for benchmarks: the share outside model forwards is the overhead."""

    steps: int = 0
    tokens: int = 0
    step_s: float = 0.0
    target_forward_s: float = 0.0
    draft_forward_s: float = 0.0
    cost_ratio: float | None = None  # the last step's actual / predicted ms (a policy that predicts it), or None

    @property
    def overhead_share(self) -> float:
        fwd = self.target_forward_s + self.draft_forward_s
        return 0.0 if self.step_s == 0 else max(0.0, 1.0 - fwd / self.step_s)


__all__ = ["EngineStats", "RunningSeq"]
