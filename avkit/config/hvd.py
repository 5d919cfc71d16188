"""Hybrid Verified Decoding: the suffix cache, the replay, its cost model and the payoff MLP (docs/hvd.md)."""

from __future__ import annotations

from dataclasses import dataclass

from avkit.config.fields import DEFAULT_K, MAX_K, Checked, checked
from avkit.validate import in_range


@dataclass(frozen=True)
class SuffixCacheConfig(Checked):
    """SuffixDecoding cache drafter (docs/hvd.md); defaults follow vLLM's suffix decoding."""

    max_depth: int = checked(24, 1, help="suffix trie depth")  # longest suffix stored per position
    max_spec_factor: float = checked(1.0, 0.0)  # draft length <= match_len * factor + offset
    max_spec_offset: float = checked(0.0, -1e9)
    min_token_prob: float = checked(0.1, 0.0, 1.0)  # stop when the path's frequency probability falls below this
    max_cached_requests: int = checked(100, 0)  # global tree: FIFO eviction by request beyond this many
    # global tree: FIFO eviction beyond this many response tokens (~5 kB each)
    max_cached_tokens: int = checked(50_000, 0)
    use_global: bool = True  # also draft from past responses


@dataclass(frozen=True)
class HvdCostConfig(Checked):
    """HVD's linear cost model, in units of one target forward (the defaults of `avkit hvd`): a target
    forward over T tokens costs 1 + c_v * T, a draft-model step c_d. A measured table (`avkit hvd
    --cost-table`) replaces the lines; pricing is the cost model's (avkit/hvd/cost.py: a unit view of it)."""

    verify_token_cost: float = checked(0.02, 0.0)  # extra target cost per verified draft token
    # CPU: ~3 vs ~9 tok/s (docs/runtime.md)
    draft_step_cost: float = checked(0.33, 0.0, help="one draft-model step, in target forwards")
    cache_cost: float = checked(0.005, 0.0)  # suffix lookup + payoff predictor, per request consulting it


@dataclass(frozen=True)
class PayoffConfig(Checked):
    """Payoff MLP (predicts the cache draft's accepted length) and its training run."""

    hidden: int = checked(64, 1)
    layers: int = checked(2, 1)
    epochs: int = checked(30, 1, help="payoff MLP epochs")
    batch_size: int = checked(1024, 1)
    lr: float = checked(3e-3, 0.0, lo_open=True)
    weight_decay: float = checked(1e-4, 0.0)
    # requests held out to choose tau (split by request, never by row)
    val_fraction: float = checked(0.2, 0.0, 1.0, lo_open=True, hi_open=True)
    test_fraction: float = 0.2  # requests held out for the reported metrics
    seed: int = checked(0, help="split and training seed")

    def __post_init__(self):
        super().__post_init__()
        in_range(self, "test_fraction", 0.0, 1.0 - self.val_fraction, hi_open=True)


@dataclass(frozen=True)
class HvdReplayConfig(Checked):
    """Trace replay for hybrid verified decoding."""

    # also caps the cache drafts
    k: int = checked(DEFAULT_K, 1, MAX_K, help="model draft length K", flags=("-k", "--k"))
    history_window: int = checked(16, 1)  # positions in the recent-acceptance features
    high_payoff: int = checked(6, 1)  # precision/recall threshold on accepted length (the paper's >= 6)
