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
    prefill_tokens: tuple[int, ...]  # [U] the drafter's prefill price curve, tokens of one request
    prefill_ms: tuple[float, ...]  # [U]
    source: str = ""  # where it was read from (messages)

    def __post_init__(self):
        where = f"{self.source}: " if self.source else ""
        conc, saving = _curve("concurrency/saving_ms", self.concurrency, self.saving_ms, where)
        tokens, ms = _curve("prefill_tokens/prefill_ms", self.prefill_tokens, self.prefill_ms, where)
        for name, value in (("concurrency", conc), ("saving_ms", saving), ("prefill_tokens", tokens), ("prefill_ms", ms)):
            object.__setattr__(self, name, value)
        if min(self.prefill_ms) < 0:
            raise ConfigError(f"{where}catch_up.prefill_ms must be >= 0, got {list(self.prefill_ms)}")

    def price_ms(self, lag: np.ndarray) -> np.ndarray:
        """[n] tokens -> [n] ms of drafter prefill (linear, the last segment's slope beyond the curve)."""
        x, y = np.asarray(self.prefill_tokens, np.float64), np.asarray(self.prefill_ms, np.float64)
        lag = np.asarray(lag, np.float64)
        out = np.interp(lag, x, y)
        if x.size > 1:
            out = np.where(lag > x[-1], y[-1] + (y[-1] - y[-2]) / (x[-1] - x[-2]) * (lag - x[-1]), out)
        return out

    def saving_at(self, batch_size: int) -> float:
        return float(np.interp(batch_size, self.concurrency, self.saving_ms))

    def drafts(self, lag, remaining, batch_size: int) -> np.ndarray:
        """[n] bool: which of n requests (lag [n], remaining [n] host ints) draft at this batch size."""
        lag, remaining = np.asarray(lag, np.int64), np.asarray(remaining, np.int64)
        pays = self.price_ms(lag) <= remaining * self.saving_at(batch_size)
        return (lag <= FREE_LAG) | pays

    def to_json(self) -> dict:
        return {"concurrency": list(self.concurrency), "saving_ms": list(self.saving_ms),
                "prefill_tokens": list(self.prefill_tokens), "prefill_ms": list(self.prefill_ms)}

    @classmethod
    def from_json(cls, data, source: str = "") -> CatchUpRule:
        if not isinstance(data, dict) or any(k not in data for k in ("concurrency", "saving_ms", "prefill_tokens",
                                                                     "prefill_ms")):
            raise ConfigError(f"{source + ': ' if source else ''}catch_up must be an object with concurrency, "
                              f"saving_ms, prefill_tokens and prefill_ms, got {data!r}"[:300])
        return cls(tuple(data["concurrency"]), tuple(data["saving_ms"]), tuple(data["prefill_tokens"]),
                   tuple(data["prefill_ms"]), source)


__all__ = ["FREE_LAG", "PRICE_GRID", "CatchUpRule"]
