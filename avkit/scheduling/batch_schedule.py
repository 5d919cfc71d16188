"""The `schedule` verify policy: K by the current batch size, as vLLM's Dynamic SD runs it.

A schedule is inclusive batch-size ranges (lo, hi, K), the first from 1, read from `avkit tune --out` JSON
(`schedule.ranges`, with its catch-up rule `schedule.catch_up`, scheduling/batch_schedule.py) or a `--format vllm`
fragment (`null`: speculation off everywhere). As vLLM 0.32's dense lookup: b past the last range takes its
K; a K above the engine's -k is refused at load (vLLM clamps silently). Each step, b = requests in the step:
each request drafts at most K(b) (K = 0: no drafter forward) and verifies min(drafted, K(b)). Lossless:
only lengths and counts decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np
import torch

from avkit.errors import ConfigError
from avkit.jsonsafe import read_json
from avkit.scheduling.cost import FREE_LAG, CostTable, interp_curve, number_list
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
    """POLICIES["schedule"] factory (a lazy entry in spec.py): a schedule file or a BatchSchedule, the engine's K."""
    return ScheduledK(schedule if isinstance(schedule, BatchSchedule) else BatchSchedule.load(schedule), k=k)


# ---- catch-up: whether a request whose drafter is behind drafts again. A request that has not drafted (new,
# or sat out a K = 0 range) lacks tokens in the draft model's KV cache; the first step that drafts it prefills
# them while the whole batch waits. Per request:
#   lag          tokens its drafter has not seen; remaining: new tokens it may still emit (an upper bound)
#   saving(b)    batch ms saved per output token by drafting at batch size b: 1000 / tok_s(no-spec, b) -
#                1000 / tok_s(schedule's arm at b) from `avkit tune`, linear in b, flat beyond
#   rule         drafts iff lag <= FREE_LAG or cost.catch_up_cost(lag) <= remaining * saving(b)
#   step check   when only m < b requests may draft, the step drafts only if, with a(b) the tuner's mean
#                accepted drafts and k = K(b):
#                  (b + m a(b)) / step_ms(b, m drafting k, b + m k) > (1 + STEP_MARGIN) b / step_ms(b, 0, b)
#                (the margin: per-step speculative bookkeeping the curves miss; live on this CPU at c=2 a step
#                priced at +1.2% over target-only lost to it)
STEP_MARGIN = 0.05  # a partly drafting step must beat target-only by this share (catch-up note)
TUNED = ("concurrency", "saving_ms", "accepted")  # the tuner's curves, by batch size
OLD_CURVES = ("prefill_tokens", "prefill_ms", "verify_tokens", "verify_ms", "draft_requests", "draft_ms")


@dataclass(frozen=True)
class CatchUpRule:
    concurrency: tuple[int, ...]  # [C] batch sizes the tuner simulated, increasing
    saving_ms: tuple[float, ...]  # [C] batch ms saved per output token by drafting there (<= 0: never pays)
    accepted: tuple[float, ...]  # [C] mean accepted drafts per drafting request-step there (the tuner's arm)
    cost: CostTable  # the cost model that prices the catch-up and the step check
    source: str = ""  # where it was read from (messages)

    def __post_init__(self):
        where = f"{self.source}: catch_up" if self.source else "catch_up"
        for name in TUNED:  # lists of finite numbers, as a cost table's (cost.py `number_list`)
            object.__setattr__(self, name, number_list(where, name, getattr(self, name), integer=name == "concurrency"))
        c, a = self.concurrency, self.accepted
        if len({len(c), len(self.saving_ms), len(a)}) > 1 or c[0] < 1 or any(y <= x for x, y in pairwise(c)) \
                or min(a) < 0:
            raise ConfigError(f"{where}: concurrency, saving_ms and accepted need equal lengths, concurrency increasing "
                              f"from >= 1 and accepted >= 0, got {list(c)}, {list(self.saving_ms)} and {list(a)}")

    def step_pays(self, m: int, b: int, k: int) -> bool:
        """The step check (module note): m of b requests drafting k each beats target-only decoding."""
        a = float(interp_curve(b, self.concurrency, self.accepted, beyond="flat"))
        spec_ms, base_ms = self.cost.step_cost(b, k, b + m * k, draft_rows=m), self.cost.step_cost(b, 0, b)
        return bool((b + m * min(a, k)) / spec_ms > (1.0 + STEP_MARGIN) * b / base_ms)

    def plan(self, lag, remaining, batch_size: int, k: int) -> np.ndarray:
        """[n] bool: which requests draft this step: the rule per request, then the step check."""
        ok = self.drafts(lag, remaining, batch_size)
        m = int(ok.sum())
        if 0 < m < batch_size and not self.step_pays(m, batch_size, k):
            ok[:] = False
        return ok

    def drafts(self, lag, remaining, batch_size: int) -> np.ndarray:
        """[n] bool: which of n requests (lag [n], remaining [n] host ints) draft at this batch size."""
        lag, remaining = np.asarray(lag, np.int64), np.asarray(remaining, np.int64)
        saving = float(interp_curve(batch_size, self.concurrency, self.saving_ms, beyond="flat"))  # ms per token
        return (lag <= FREE_LAG) | (self.cost.catch_up_cost(lag) <= remaining * saving)

    def to_json(self) -> dict:
        return {**{name: list(getattr(self, name)) for name in TUNED}, "cost": self.cost.to_json()}

    @classmethod
    def from_json(cls, data, source: str = "") -> CatchUpRule:
        """Back from `to_json`; older files carried copies of the cost curves (OLD_CURVES) instead of the model."""
        old = isinstance(data, dict) and "cost" not in data
        if not isinstance(data, dict) or any(not isinstance(data.get(n), list) for n in TUNED + (OLD_CURVES if old else ())):
            raise ConfigError(f"{source + ': ' if source else ''}catch_up must be an object of lists {', '.join(TUNED)} "
                              f"and a cost model; got {data!r}"[:400])
        cost = {**{n: data[n] for n in OLD_CURVES}, "meta": {"source": "catch-up rule"}} if old else data["cost"]
        return cls(*(data[n] for n in TUNED), cost=CostTable.from_json(cost, source), source=source)
