"""Catch-up: whether a request whose drafter is behind drafts again (the `schedule` policy's rule).

A request that has not drafted (new, or sat out a K = 0 range) lacks tokens in the draft model's KV cache;
the first step that drafts it prefills them while the whole batch waits. Per request:
  lag          tokens its drafter has not seen; remaining: new tokens it may still emit (an upper bound)
  saving(b)    batch ms saved per output token by drafting at batch size b: 1000 / tok_s(no-spec, b) -
               1000 / tok_s(schedule's arm at b) from `avkit tune`, linear in b, flat beyond
  rule         drafts iff lag <= FREE_LAG or cost.catch_up_cost(lag) <= remaining * saving(b)
  step check   when only m < b requests may draft, the step drafts only if, with a(b) the tuner's mean
               accepted drafts and k = K(b):
                 (b + m a(b)) / step_ms(b, m drafting k, b + m k) > (1 + STEP_MARGIN) b / step_ms(b, 0, b)
               (the margin: per-step speculative bookkeeping the curves miss; live on this CPU at c=2 a step
               priced at +1.2% over target-only lost to it)
Lossless: lags, remaining tokens and b are counts, never a draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from avkit.errors import ConfigError
from avkit.scheduling.cost import FREE_LAG, CostTable, interp_curve

STEP_MARGIN = 0.05  # a partly drafting step must beat target-only by this share (module note)
TUNED = ("concurrency", "saving_ms", "accepted")  # the tuner's curves, by batch size
OLD_CURVES = {"prefill_tokens": "prefill_ms", "verify_tokens": "verify_ms", "draft_requests": "draft_ms"}


def _curve(name: str, xs, ys, where: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    try:
        x, y = tuple(int(v) for v in xs), tuple(float(v) for v in ys)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}catch_up.{name} must be lists of numbers, got {xs!r} and {ys!r}") from None
    if not x or len(x) != len(y) or any(b <= a for a, b in pairwise(x)) or x[0] < 1 \
            or not all(np.isfinite(y)):
        raise ConfigError(f"{where}catch_up.{name} needs equal non-empty lists, x increasing from >= 1 and finite "
                          f"ms, got {list(x)} and {list(y)}")
    return x, y


@dataclass(frozen=True)
class CatchUpRule:
    concurrency: tuple[int, ...]  # [C] batch sizes the tuner simulated, increasing
    saving_ms: tuple[float, ...]  # [C] batch ms saved per output token by drafting there (<= 0: never pays)
    accepted: tuple[float, ...]  # [C] mean accepted drafts per drafting request-step there (the tuner's arm)
    cost: CostTable  # the cost model that prices the catch-up and the step check
    source: str = ""  # where it was read from (messages)

    def __post_init__(self):
        where = f"{self.source}: " if self.source else ""
        c, s = _curve("concurrency/saving_ms", self.concurrency, self.saving_ms, where)
        _, a = _curve("concurrency/accepted", self.concurrency, self.accepted, where)
        if min(a) < 0:
            raise ConfigError(f"{where}catch_up.accepted must be >= 0, got {list(a)}")
        object.__setattr__(self, "concurrency", c)
        object.__setattr__(self, "saving_ms", s)
        object.__setattr__(self, "accepted", a)

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
        pays = self.cost.catch_up_cost(lag) <= remaining * saving
        return (lag <= FREE_LAG) | pays

    def to_json(self) -> dict:
        return {**{name: list(getattr(self, name)) for name in TUNED}, "cost": self.cost.to_json()}

    @classmethod
    def from_json(cls, data, source: str = "") -> CatchUpRule:
        """Back from `to_json`; older files carried copies of the cost curves instead of the cost model."""
        where = f"{source}: " if source else ""
        old = isinstance(data, dict) and "cost" not in data
        names = list(TUNED) + ([n for pair in OLD_CURVES.items() for n in pair] if old else [])
        if not isinstance(data, dict) or any(not isinstance(data.get(n), list) for n in names):
            raise ConfigError(f"{where}catch_up must be an object of lists {', '.join(TUNED)} and a cost model; "
                              f"got {data!r}"[:400])
        if old:
            curves = {}
            for x, y in OLD_CURVES.items():
                curves[x], curves[y] = _curve(f"{x}/{y}", data[x], data[y], where)
            cost = CostTable(**curves, meta={"source": "catch-up rule"})
        else:
            cost = CostTable.from_json(data["cost"], source)
        return cls(*(tuple(data[n]) for n in TUNED), cost=cost, source=source)


__all__ = ["FREE_LAG", "STEP_MARGIN", "CatchUpRule"]
