"""Catch-up: whether a request whose drafter is behind should draft again (the `schedule` policy's rule).

The draft model's KV cache holds a prefix of each sequence (drafters/draft_model.py). A request that has
not drafted lacks tokens there: a new one its prompt, one that sat out steps (a schedule's K = 0 at a larger
batch) everything decoded meanwhile. The first step that drafts it prefills them, and the whole batch waits
for that forward. Drafting pays it back only over the tokens the request has left, so:

  lag          tokens of the sequence the drafter has not seen (host count, `Drafter.lag`)
  remaining    new tokens the request may still emit, max_new_tokens - emitted: an upper bound (EOS may
               come first), so the rule errs towards drafting
  price(lag)   prefill_ms(lag): the drafter's prefill of one request (the cost table's `prefill_ms`,
               profiled; a draft pass over lag rows, an upper bound, where the table has none)
  saving(b)    batch ms saved per output token by drafting at batch size b: 1000 / tok_s(no-spec, b) -
               1000 / tok_s(schedule's arm at b), from `avkit tune`'s simulated table, linear in b between
               the concurrencies it simulated and the nearest one's beyond them
  rule         a request drafts iff lag <= FREE_LAG (the first draft pass feeds those tokens itself) or
               price(lag) <= remaining * saving(b)
  step check   saving(b) assumes every request of the batch drafts. When only m < b may, the drafter's
               passes serve fewer of them; the step drafts only if that still beats target-only decoding,
               by the cost table's curves and the tuner's mean accepted drafts a(b) per drafting request,
               with a margin for what the curves miss (the engine's per-step speculative bookkeeping: live
               on this CPU at c=2, a step priced at +1.2% over target-only lost to it):
                 (b + m a(b)) / (verify_ms(b + m k) + k draft_ms(m))  >  (1 + STEP_MARGIN) b / verify_ms(b)
               (k = the schedule's K(b)); otherwise no request drafts this step

A request kept out stays out while its lag grows and its remaining shrinks at that batch size; it drafts
again where saving(b) is large enough (a smaller batch) or never. The steady-state tuner cannot see these
switches (it simulates one batch size at a time); the rule is where they are priced.
Lossless: lag, remaining and b are lengths and counts, never a draw (docs/lossless.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from avkit.errors import ConfigError

FREE_LAG = 2  # tokens the first draft pass feeds itself (the draft x_K and the bonus token); more are prefilled
PRICE_GRID = (16, 64, 256, 512)  # lags the price curve is profiled (and exported) at
STEP_MARGIN = 0.05  # a partly drafting step must beat target-only by this share (module note)


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


def _linear(x, xs, ys) -> np.ndarray:
    """Piecewise linear in (xs, ys), the last segment's slope beyond it, the first value below it."""
    xs, ys, x = np.asarray(xs, np.float64), np.asarray(ys, np.float64), np.asarray(x, np.float64)
    out = np.interp(x, xs, ys)
    if xs.size > 1:
        out = np.where(x > xs[-1], ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (x - xs[-1]), out)
    return out


CURVES = (("concurrency", "saving_ms"), ("concurrency", "accepted"), ("prefill_tokens", "prefill_ms"),
          ("verify_tokens", "verify_ms"), ("draft_requests", "draft_ms"))


@dataclass(frozen=True)
class CatchUpRule:
    concurrency: tuple[int, ...]  # [C] batch sizes the tuner simulated, increasing
    saving_ms: tuple[float, ...]  # [C] batch ms saved per output token by drafting there (<= 0: never pays)
    accepted: tuple[float, ...]  # [C] mean accepted drafts per drafting request-step there (the tuner's arm)
    prefill_tokens: tuple[int, ...]  # [U] the drafter's prefill price curve, tokens of one request
    prefill_ms: tuple[float, ...]  # [U]
    verify_tokens: tuple[int, ...]  # [P] the cost table's target forward by tokens (the step check)
    verify_ms: tuple[float, ...]  # [P]
    draft_requests: tuple[int, ...]  # [Q] the cost table's draft pass by requests
    draft_ms: tuple[float, ...]  # [Q]
    source: str = ""  # where it was read from (messages)

    def __post_init__(self):
        where = f"{self.source}: " if self.source else ""
        for xname, yname in CURVES:
            x, y = _curve(f"{xname}/{yname}", getattr(self, xname), getattr(self, yname), where)
            object.__setattr__(self, xname, x)
            object.__setattr__(self, yname, y)
            if yname != "saving_ms" and min(y) < 0:
                raise ConfigError(f"{where}catch_up.{yname} must be >= 0, got {list(y)}")

    def price_ms(self, lag: np.ndarray) -> np.ndarray:
        """[n] tokens -> [n] ms of drafter prefill (linear, the last segment's slope beyond the curve)."""
        return _linear(lag, self.prefill_tokens, self.prefill_ms)

    def step_pays(self, m: int, b: int, k: int) -> bool:
        """The step check (module note): m of b requests drafting k each beats target-only decoding."""
        a = float(np.interp(b, self.concurrency, self.accepted))
        spec = (b + m * min(a, k)) / (_linear(b + m * k, self.verify_tokens, self.verify_ms)
                                      + k * _linear(m, self.draft_requests, self.draft_ms))
        return bool(spec > (1.0 + STEP_MARGIN) * b / _linear(b, self.verify_tokens, self.verify_ms))

    def plan(self, lag, remaining, batch_size: int, k: int) -> np.ndarray:
        """[n] bool: which requests draft this step: the rule per request, then the step check."""
        ok = self.drafts(lag, remaining, batch_size)
        m = int(ok.sum())
        if 0 < m < batch_size and not self.step_pays(m, batch_size, k):
            ok[:] = False
        return ok

    def saving_at(self, batch_size: int) -> float:
        return float(np.interp(batch_size, self.concurrency, self.saving_ms))

    def drafts(self, lag, remaining, batch_size: int) -> np.ndarray:
        """[n] bool: which of n requests (lag [n], remaining [n] host ints) draft at this batch size."""
        lag, remaining = np.asarray(lag, np.int64), np.asarray(remaining, np.int64)
        pays = self.price_ms(lag) <= remaining * self.saving_at(batch_size)
        return (lag <= FREE_LAG) | pays

    def to_json(self) -> dict:
        return {name: list(getattr(self, name)) for name in dict.fromkeys(n for pair in CURVES for n in pair)}

    @classmethod
    def from_json(cls, data, source: str = "") -> CatchUpRule:
        names = list(dict.fromkeys(n for pair in CURVES for n in pair))
        if not isinstance(data, dict) or any(not isinstance(data.get(n), list) for n in names):
            raise ConfigError(f"{source + ': ' if source else ''}catch_up must be an object of lists "
                              f"{', '.join(names)}; got {data!r}"[:400])
        return cls(**{n: tuple(data[n]) for n in names}, source=source)


__all__ = ["FREE_LAG", "PRICE_GRID", "STEP_MARGIN", "CatchUpRule"]
