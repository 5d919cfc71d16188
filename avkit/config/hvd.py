"""Hybrid Verified Decoding: the suffix cache, the replay, its cost model and the payoff MLP (docs/hvd.md)."""

from __future__ import annotations

from dataclasses import dataclass

from avkit.config.fields import DEFAULT_K, MAX_K
from avkit.validate import in_range


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
        in_range(self, "max_depth", 1)
        in_range(self, "max_spec_factor", 0.0)
        in_range(self, "max_spec_offset", -1e9)
        in_range(self, "min_token_prob", 0.0, 1.0)
        in_range(self, "max_cached_requests", 0)
        in_range(self, "max_cached_tokens", 0)


@dataclass(frozen=True)
class HvdCostConfig:
    """HVD's linear cost model, in units of one target forward (the defaults of `avkit hvd`): a target
    forward over T tokens costs 1 + c_v * T, a draft-model step c_d. A measured table (`avkit hvd
    --cost-table`) replaces the lines; pricing is avkit/hvd/cost.py's `HvdCost`, a view of the cost model."""

    verify_token_cost: float = 0.02  # extra target cost per verified draft token
    draft_step_cost: float = 0.33  # one draft-model step (CPU: ~3 vs ~9 tok/s, docs/runtime.md)
    cache_cost: float = 0.005  # suffix lookup + payoff predictor

    def __post_init__(self):
        in_range(self, "verify_token_cost", 0.0)
        in_range(self, "draft_step_cost", 0.0)
        in_range(self, "cache_cost", 0.0)


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
        in_range(self, "hidden", 1)
        in_range(self, "layers", 1)
        in_range(self, "epochs", 1)
        in_range(self, "batch_size", 1)
        in_range(self, "lr", 0.0, lo_open=True)
        in_range(self, "weight_decay", 0.0)
        in_range(self, "val_fraction", 0.0, 1.0, lo_open=True, hi_open=True)
        in_range(self, "test_fraction", 0.0, 1.0 - self.val_fraction, hi_open=True)


@dataclass(frozen=True)
class HvdReplayConfig:
    """Trace replay for hybrid verified decoding."""

    k: int = DEFAULT_K  # model drafter's draft length; also caps cache drafts
    history_window: int = 16  # positions in the recent-acceptance features
    high_payoff: int = 6  # precision/recall threshold on accepted length (the paper's >= 6)

    def __post_init__(self):
        in_range(self, "k", 1, MAX_K)
        in_range(self, "history_window", 1)
        in_range(self, "high_payoff", 1)


__all__ = ["HvdCostConfig", "HvdReplayConfig", "PayoffConfig", "SuffixCacheConfig"]
