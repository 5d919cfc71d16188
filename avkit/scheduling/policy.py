"""Verify policies: how many of each request's K drafts the target verifies this step.

A policy sees only what cannot depend on which draft token was drawn: the lossless features of
the draft distributions and the load. That is what keeps every policy lossless (docs/lossless.md).
Glossary:
  num_verify  k_r in [0, num_drafted_r], the verified prefix length of request r
  load        requests that sample this step (N_s) and non-draft tokens already scheduled (T)
Policies implement the `VerifyPolicy` protocol and live in `POLICIES`, looked up by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from avkit.errors import ConfigError
from avkit.registry import Registry


@dataclass(frozen=True)
class Load:
    """What the scheduler knows about this step besides the drafts."""

    num_requests: int  # requests in the step
    num_sampling: int  # N_s: requests that sample a token this step (not mid-prefill)
    num_scheduled_tokens: int  # T: non-draft target tokens already scheduled (1 per decoding request + prefill)


@dataclass(frozen=True)
class DraftBatch:
    """Lossless features of this step's drafts. Never holds q(x_sampled) or the drawn tokens."""

    features: dict[str, torch.Tensor]  # name -> [B, K] float32, lossless features only
    num_drafted: torch.Tensor  # [B] int64, drafts proposed per request (<= K)


@dataclass(frozen=True)
class VerifyOutcome:
    """What verification decided, fed back to the policy for online refits."""

    features: dict[str, torch.Tensor]  # name -> [B, K] (same as DraftBatch)
    confidences: torch.Tensor | None  # [B, K] predictions used when deciding (None if none)
    num_verify: torch.Tensor  # [B] int64
    num_accepted: torch.Tensor  # [B] int64
    # Labels follow docs/estimator.md: slot j of request r is observed iff j < num_verify[r] and
    # j <= num_accepted[r] (at or before the first rejection); label = j < num_accepted[r].


class VerifyPolicy(Protocol):
    name: str

    def num_verify(self, batch: DraftBatch, load: Load) -> torch.Tensor:  # [B] int64
        ...

    def observe(self, outcome: VerifyOutcome) -> None:
        ...


@dataclass
class FullVerification:
    """Verify every draft: the classic speculative decoding step."""

    name: str = "full"

    def num_verify(self, batch: DraftBatch, load: Load) -> torch.Tensor:
        return batch.num_drafted.clone()

    def observe(self, outcome: VerifyOutcome) -> None:
        pass


@dataclass
class FixedK:
    """Verify the first k drafts of every request (k <= drafted)."""

    k: int
    name: str = field(default="fixed")

    def __post_init__(self):
        if self.k < 0:
            raise ConfigError(f"fixed-k policy: k must be >= 0, got {self.k}")
        self.name = f"fixed{self.k}"

    def num_verify(self, batch: DraftBatch, load: Load) -> torch.Tensor:
        return batch.num_drafted.clamp(max=self.k)

    def observe(self, outcome: VerifyOutcome) -> None:
        pass


# name -> factory(**kwargs) -> VerifyPolicy; "adaptive" is imported the first time it is looked up.
POLICIES = Registry("verify policy", {
    "full": FullVerification,
    "fixed": FixedK,
    "adaptive": "avkit.scheduling.adaptive:make_adaptive",
})


def make_policy(name: str, **kwargs) -> VerifyPolicy:
    return POLICIES.make(name, **kwargs)
