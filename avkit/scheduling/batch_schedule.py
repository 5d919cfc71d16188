"""The `schedule` verify policy: K by the current batch size, as vLLM's Dynamic SD runs it.

A schedule is inclusive batch-size ranges (lo, hi, K), the first from 1, read from `avkit tune --out` JSON
(`schedule.ranges`, with its catch-up rule `schedule.catch_up`, scheduling/catch_up.py) or a `--format vllm`
fragment (`null`: speculation off everywhere). As vLLM 0.32's dense lookup: b past the last range takes its
K; a K above the engine's -k is refused at load (vLLM clamps silently). Each step, b = requests in the step:
each request drafts at most K(b) (K = 0: no drafter forward) and verifies min(drafted, K(b)). Lossless:
only lengths and counts decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from avkit.errors import ConfigError
from avkit.jsonsafe import read_json
from avkit.scheduling.catch_up import CatchUpRule
from avkit.scheduling.policy import VerifyPolicy
from avkit.step_types import DraftBatch, Groups, Load, StepPlan


@dataclass(frozen=True)
class BatchSchedule:
    """Validated (lo, hi, K) ranges and their dense lookup."""

    ranges: tuple[tuple[int, int, int], ...]
    source: str = ""  # the file it came from (for messages)
    catch_up: CatchUpRule | None = None  # when a lagging request drafts again (None: always, vLLM's way)
    dense: np.ndarray = field(init=False, repr=False, compare=False)  # [last hi + 1] K by batch size; [0] unused

    def __post_init__(self):
        from avkit.tune.formats import check_vllm  # lazy: polars (avkit.tune.formats; the engine imports this module)

        where = f"{self.source}: " if self.source else ""
        if not self.ranges:
            raise ConfigError(f"{where}the schedule has no batch-size ranges")
        top = max(k for _, _, k in self.ranges)
        try:  # vLLM's rules (formats.check_vllm), with num_speculative_tokens >= 1 even when K is 0 everywhere
            check_vllm({"num_speculative_tokens": max(top, 1),
                        "num_speculative_tokens_per_batch_size": [list(r) for r in self.ranges]})
        except ConfigError as e:
            raise ConfigError(f"{where}{e}") from None
        dense = np.zeros(self.ranges[-1][1] + 1, dtype=np.int64)
        for lo, hi, k in self.ranges:
            dense[lo:hi + 1] = k
        object.__setattr__(self, "dense", dense)

    @property
    def max_k(self) -> int:
        return int(self.dense.max())

    def k_at(self, batch_size: int) -> int:
        """K at this batch size (past the last range: the last range's K)."""
        return int(self.dense[min(max(batch_size, 1), self.dense.size - 1)])

    def k_of(self, groups: Groups) -> torch.Tensor:
        """[B] K of each row's step (`k_at` of its step's batch size), for many steps at once."""
        n = groups.num_requests.clamp(1, self.dense.size - 1)  # [G]
        return torch.from_numpy(self.dense)[n][groups.group]

    @classmethod
    def load(cls, path: str | Path) -> BatchSchedule:
        """From `avkit tune --out` JSON or a `--format vllm` fragment; one ConfigError line naming the file."""
        p = Path(path)
        data = read_json(p, "--schedule")
        rule = data.get("schedule", {}).get("catch_up") if isinstance(data, dict) and \
            isinstance(data.get("schedule"), dict) else None
        return cls(_ranges(data, p), source=str(p),
                   catch_up=CatchUpRule.from_json(rule, f"--schedule {p}") if rule is not None else None)


def _ranges(data, path: Path) -> tuple[tuple[int, int, int], ...]:
    if data is None:  # `avkit tune --format vllm`'s "speculation off everywhere"
        return ((1, 1, 0),)
    if isinstance(data, dict) and isinstance(data.get("schedule"), dict) and "ranges" in data["schedule"]:
        raw = data["schedule"]["ranges"]  # avkit tune --out
    elif isinstance(data, dict) and "speculative_config" in data:
        spec = data["speculative_config"]
        if spec is None:  # the tuner's "speculation off everywhere"
            return ((1, 1, 0),)
        raw = spec.get("num_speculative_tokens_per_batch_size") if isinstance(spec, dict) else None
    elif isinstance(data, dict) and "num_speculative_tokens_per_batch_size" in data:
        raw = data["num_speculative_tokens_per_batch_size"]
    else:
        raise ConfigError(f"--schedule {path}: neither `avkit tune` results (schedule.ranges) nor a vLLM "
                          "speculative_config with num_speculative_tokens_per_batch_size")
    if not isinstance(raw, list) or not all(isinstance(r, list | tuple) and len(r) == 3 for r in raw):
        raise ConfigError(f"--schedule {path}: ranges must be a list of (batch_lo, batch_hi, K), got {raw!r}")
    if not all(isinstance(x, int) and not isinstance(x, bool) for r in raw for x in r):
        raise ConfigError(f"--schedule {path}: range bounds and K must be integers, got {raw!r}")
    return tuple((int(lo), int(hi), int(k)) for lo, hi, k in raw)


@dataclass
class ScheduledK(VerifyPolicy):
    """POLICIES["schedule"]: K(b) drafts drafted and verified per request at batch size b (module note)."""

    schedule: BatchSchedule
    k: int = 0  # the engine's K (0: not checked)
    name: str = "schedule"

    def __post_init__(self):
        if self.k and self.schedule.max_k > self.k:
            b = int(np.argmax(self.schedule.dense))
            raise ConfigError(f"--schedule {self.schedule.source}: K={self.schedule.max_k} at batch size {b} "
                              f"is more than the engine drafts (k={self.k}); raise -k or lower the schedule")

    def draft_limits(self, load: Load | Groups, lag, remaining):
        if isinstance(load, Groups):  # the simulator's steps: no lags (its traces start caught up)
            return self.schedule.k_of(load)
        k, rule = self.schedule.k_at(load.num_requests), self.schedule.catch_up
        if k == 0 or rule is None:
            return [k] * len(lag)
        return [k if ok else 0 for ok in rule.plan(lag, remaining, load.num_requests, k).tolist()]

    def num_verify(self, batch: DraftBatch, load: Load | Groups) -> StepPlan:
        if isinstance(load, Groups):
            return StepPlan(torch.minimum(batch.num_drafted, self.schedule.k_of(load)))  # [B] int64
        return StepPlan(batch.num_drafted.clamp(max=self.schedule.k_at(load.num_requests)))  # [B] int64


def make_scheduled(schedule: str | Path | BatchSchedule, k: int = 0) -> ScheduledK:
    """POLICIES["schedule"] factory (a lazy entry in policy.py): a schedule file or a BatchSchedule, the engine's K."""
    return ScheduledK(schedule if isinstance(schedule, BatchSchedule) else BatchSchedule.load(schedule), k=k)

