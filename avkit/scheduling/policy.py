"""Verify policies: how many of each request's drafts the target verifies this step.

A policy sees only what no drawn draft token decides (lossless features, the load: docs/lossless.md). The
engine hands it one step (`Load`), the simulator many (`Groups`, one group per step); the same object
decides both. The step's types live in avkit/step_types.py; the names in `POLICIES` (spec.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from avkit.errors import ConfigError
from avkit.step_types import DraftBatch, Groups, Load, StepPlan, StepTime, VerifyOutcome


class VerifyPolicy(Protocol):
    """The engine's contract: policies subclass it and inherit the optional hooks' defaults."""

    name: str

    def num_verify(self, batch: DraftBatch, load: Load | Groups) -> StepPlan:
        """k_r per request (and the confidences it used) from lossless features and the load."""
        ...

    def observe(self, outcome: VerifyOutcome) -> None:
        """What verification decided (labels for online refits)."""

    def use_kernels(self, kernels) -> None:
        """The engine's kernel set (kernels/dispatch.py `Kernels`), chosen once; default: unused."""

    def draft_this_step(self, load: Load) -> bool:
        """Before drafting, from earlier steps only: False skips speculation this step (default: draft)."""
        return True

    def draft_steps(self, batch: DraftBatch, groups: Groups) -> torch.Tensor | None:
        """The simulator's `draft_this_step`: [G] bool in step order (`batch`: the drafts every step would
        propose); None (default): every step."""
        return None

    def draft_limits(self, load: Load | Groups, lag: list[int] | None, remaining: list[int] | None):
        """Before drafting: [B] most drafts each request may propose (lag: tokens its drafter has not seen;
        remaining: new tokens it may still emit; [B] host ints, None for `Groups`); None (default): K."""
        return None

    def confidence_coefficients(self, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(slope [1], intercepts [K]) for the confidence kernel, sigma(slope logit(q_max) + intercept_i);
        None (default): the policy predicts from the features itself."""
        return None

    def continue_drafting(self, batch: DraftBatch, load: Load | Groups) -> torch.Tensor | None:
        """After each pass of an autoregressive drafter: [B] bool "draft one more"; None (default): no early stop."""
        return None

    def observe_step_time(self, timing: StepTime) -> float | None:
        """A step's shape and wall time (to learn the cost model) -> actual / predicted ms; None (default)."""
        return None


@dataclass
class FullVerification(VerifyPolicy):
    """Verify every draft: the classic speculative decoding step."""

    name: str = "full"

    def num_verify(self, batch: DraftBatch, load: Load | Groups) -> StepPlan:
        return StepPlan(batch.num_drafted.clone())


@dataclass
class FixedK(VerifyPolicy):
    """Draft and verify the first k drafts of every request (k = 0: target-only decoding)."""

    k: int
    name: str = field(default="fixed")

    def __post_init__(self):
        if self.k < 0:
            raise ConfigError(f"fixed-k policy: k must be >= 0, got {self.k}")
        self.name = f"fixed{self.k}" if self.k else "nospec"

    def draft_limits(self, load: Load | Groups, lag, remaining):
        """Drafts past k would never be verified: none are proposed."""
        rows = load.group.numel() if isinstance(load, Groups) else len(lag)
        return [self.k] * rows

    def num_verify(self, batch: DraftBatch, load: Load | Groups) -> StepPlan:
        return StepPlan(batch.num_drafted.clamp(max=self.k))
