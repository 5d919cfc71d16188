"""Verify policies: how many of each request's K drafts the target verifies this step.

A policy sees only what cannot depend on which draft token was drawn: the lossless features of
the draft distributions and the load. That is what keeps every policy lossless (docs/lossless.md).
Glossary:
  num_verify  k_r in [0, num_drafted_r], the verified prefix length of request r
  load        requests that sample this step (N_s) and non-draft tokens already scheduled (T)
Policies implement the `VerifyPolicy` protocol and live in `POLICIES`, looked up by name. The step's
types (DraftBatch, Load, StepPlan, VerifyOutcome) live in avkit/step_types.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from avkit.errors import ConfigError
from avkit.registry import Registry
from avkit.step_types import DraftBatch, Load, StepPlan, VerifyOutcome


class VerifyPolicy(Protocol):
    """The contract between the engine and a verify policy: policies subclass it, inheriting the
    optional hooks' defaults, so the engine calls every hook unconditionally (no attribute probing)."""

    name: str

    def num_verify(self, batch: DraftBatch, load: Load) -> StepPlan:
        """k_r per request (and the confidences it used) from lossless features and the load."""
        ...

    def observe(self, outcome: VerifyOutcome) -> None:
        """What verification decided (labels for online refits)."""

    def use_kernels(self, kernels) -> None:
        """The engine's kernel set (kernels/dispatch.py `Kernels`), chosen once; default: unused."""

    def draft_this_step(self, load: Load) -> bool:
        """Before drafting, from earlier steps only: False skips speculation this step (default: draft)."""
        return True

    def draft_limits(self, load: Load, lag: list[int], remaining: list[int]) -> list[int] | None:
        """Before drafting: per request the most drafts it may propose this step, from host counts no draw
        decides (lag: tokens its drafter has not seen; remaining: new tokens it may still emit; both [B]);
        None (default): no limit beyond the engine's K."""
        return None

    def confidence_coefficients(self, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(slope [1], intercepts [K]) on `device` for the confidence kernel in each draft pass, when
        the policy's predictions are sigma(slope * logit(q_max) + intercept_i); None (default): the
        policy predicts from the features itself."""
        return None

    def continue_drafting(self, batch: DraftBatch, load: Load) -> torch.Tensor | None:
        """After each pass of an autoregressive drafter: [B] bool "draft one more" from the lossless
        features so far (DraftBatch name -> [B, j]), or None: no early stop (default)."""
        return None


@dataclass
class FullVerification(VerifyPolicy):
    """Verify every draft: the classic speculative decoding step."""

    name: str = "full"

    def num_verify(self, batch: DraftBatch, load: Load) -> StepPlan:
        return StepPlan(batch.num_drafted.clone())


@dataclass
class FixedK(VerifyPolicy):
    """Verify the first k drafts of every request (k <= drafted)."""

    k: int
    name: str = field(default="fixed")

    def __post_init__(self):
        if self.k < 0:
            raise ConfigError(f"fixed-k policy: k must be >= 0, got {self.k}")
        self.name = f"fixed{self.k}"

    def num_verify(self, batch: DraftBatch, load: Load) -> StepPlan:
        return StepPlan(batch.num_drafted.clamp(max=self.k))


# name -> factory(**kwargs) -> VerifyPolicy; "adaptive" is imported the first time it is looked up.
POLICIES = Registry("verify policy", {
    "full": FullVerification,
    "fixed": FixedK,
    "adaptive": "avkit.scheduling.adaptive:make_adaptive",
    "schedule": "avkit.scheduling.batch_schedule:make_scheduled",
})


def make_policy(name: str, **kwargs) -> VerifyPolicy:
    return POLICIES.make(name, **kwargs)
