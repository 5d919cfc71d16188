"""Hybrid Verified Decoding: the suffix cache, the replay, its cost model and the payoff MLP (docs/hvd.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from avkit.config.fields import DEFAULT_K, MAX_K
from avkit.curves import interp_curve
from avkit.errors import ConfigError
from avkit.validate import check_range


@dataclass(frozen=True)
class SuffixCacheConfig:
    """SuffixDecoding cache drafter (docs/hvd.md); defaults follow vLLM's suffix decoding."""

    max_depth: int = 24  # longest suffix stored per position (trie depth)
    max_spec_factor: float = 1.0  # draft length <= match_len * factor + offset
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1  # stop when the path's frequency probability falls below this
    max_cached_requests: int = 100  # global tree: FIFO eviction by request beyond this many
    max_cached_tokens: int = 50_000  # global tree: FIFO eviction beyond this many response tokens (~5 kB each)
    use_global: bool = True  # also draft from past responses

    def __post_init__(self):
        check_range("max_depth", self.max_depth, 1)
        check_range("max_spec_factor", self.max_spec_factor, 0.0)
        check_range("max_spec_offset", self.max_spec_offset, -1e9)
        check_range("min_token_prob", self.min_token_prob, 0.0, 1.0)
        check_range("max_cached_requests", self.max_cached_requests, 0)
        check_range("max_cached_tokens", self.max_cached_tokens, 0)


@dataclass(frozen=True)
class HvdCostConfig:
    """Cost of one decoding cycle, in units of one target forward (HVD replay throughput, live joint plan).

    Linear (the defaults): a target forward over T tokens costs 1 + c_v * T, a draft-model step c_d.
    Measured (`avkit hvd --cost-table`, avkit/hvd/cost.py): the points of an `avkit profile` table, in
    target forwards of one token, interpolated like the table (last segment's slope beyond it); the
    scalars then only summarize them (c_v the slope over 1-8 tokens, c_d one request's step)."""

    verify_token_cost: float = 0.02  # extra target cost per verified draft token
    draft_step_cost: float = 0.33  # one draft-model step (CPU: ~3 vs ~9 tok/s, docs/runtime.md)
    cache_cost: float = 0.005  # suffix lookup + payoff predictor
    verify_points: tuple[tuple[float, float], ...] = ()  # (target tokens T, cost of that forward); () = linear
    draft_points: tuple[tuple[float, float], ...] = ()  # (requests n, one draft step over n rows); () = c_d
    prefill_points: tuple[tuple[float, float], ...] = ()  # (tokens, the draft model's prefill of them); () = free
    source: str = ""  # where measured points came from (the cost table's path and device)

    def __post_init__(self):
        check_range("verify_token_cost", self.verify_token_cost, 0.0)
        check_range("draft_step_cost", self.draft_step_cost, 0.0)
        check_range("cache_cost", self.cache_cost, 0.0)
        for name in ("verify_points", "draft_points", "prefill_points"):  # lists from JSON / torch.save -> tuples
            pts = tuple((float(x), float(y)) for x, y in getattr(self, name))
            object.__setattr__(self, name, pts)
            xs, ys = [x for x, _ in pts], [y for _, y in pts]
            if pts and (any(b <= a for a, b in zip(xs, xs[1:])) or min(ys) < 0 or xs[0] < 0):
                raise ConfigError(f"{name}: x must be >= 0 and increasing, costs >= 0; got {list(pts)}")

    def verify(self, tokens) -> np.ndarray:
        """Target forwards over `tokens` tokens (requests' bonus tokens + verified drafts), vectorized."""
        t = np.asarray(tokens, dtype=np.float64)
        if not self.verify_points:
            return 1.0 + self.verify_token_cost * t
        return interp_curve(t, *map(np.asarray, zip(*self.verify_points)))

    def draft(self, requests) -> np.ndarray:
        """One draft-model step over `requests` rows, vectorized."""
        n = np.asarray(requests, dtype=np.float64)
        if not self.draft_points:
            return np.full_like(n, self.draft_step_cost)
        return interp_curve(n, *map(np.asarray, zip(*self.draft_points)))

    def catch_up(self, lag) -> np.ndarray:
        """What drafting a row whose draft model lacks `lag` tokens costs first, vectorized: the prefill of
        lag - 1 tokens (drafters/draft_model.py feeds the last one with the first pass; lag <= FREE_LAG = 2
        costs nothing extra). A row the model has not drafted yet lacks its whole prompt. 0 without measured
        prefill points (the linear model prices no catch-up)."""
        lag = np.asarray(lag, dtype=np.float64)
        if not self.prefill_points:
            return np.zeros_like(lag)
        fed = lag - 1.0  # tokens the catch-up forward feeds; below the prefill grid it costs a draft step of as
        xs, ys = map(np.asarray, zip(*self.prefill_points))  # many rows (one token each, the same forward)
        cost = np.where(fed < xs[0], self.draft(np.maximum(fed, 1.0)), interp_curve(fed, xs, ys))
        return np.where(lag > 2, cost, 0.0)


@dataclass(frozen=True)
class PayoffConfig:
    """Payoff MLP (predicts the cache draft's accepted length) and its training run."""

    hidden: int = 64
    layers: int = 2
    epochs: int = 30
    batch_size: int = 1024
    lr: float = 3e-3
    weight_decay: float = 1e-4
    val_fraction: float = 0.2  # requests held out to choose tau (split by request, never by row)
    test_fraction: float = 0.2  # requests held out for the reported metrics
    seed: int = 0

    def __post_init__(self):
        check_range("hidden", self.hidden, 1)
        check_range("layers", self.layers, 1)
        check_range("epochs", self.epochs, 1)
        check_range("batch_size", self.batch_size, 1)
        check_range("lr", self.lr, 0.0, lo_open=True)
        check_range("weight_decay", self.weight_decay, 0.0)
        check_range("val_fraction", self.val_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
        check_range("test_fraction", self.test_fraction, 0.0, 1.0 - self.val_fraction, hi_open=True)


@dataclass(frozen=True)
class HvdReplayConfig:
    """Trace replay for hybrid verified decoding."""

    k: int = DEFAULT_K  # model drafter's draft length; also caps cache drafts
    history_window: int = 16  # positions in the recent-acceptance features
    high_payoff: int = 6  # precision/recall threshold on accepted length (the paper's >= 6)

    def __post_init__(self):
        check_range("k", self.k, 1, MAX_K)
        check_range("history_window", self.history_window, 1)
        check_range("high_payoff", self.high_payoff, 1)


__all__ = ["HvdCostConfig", "HvdReplayConfig", "PayoffConfig", "SuffixCacheConfig"]
