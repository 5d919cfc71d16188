"""Verify policies: how many of each request's K drafts the target verifies this step.

A policy sees only what cannot depend on which draft token was drawn: the lossless features of
the draft distributions and the load. That is what keeps every policy lossless (docs/lossless.md).
Glossary:
  num_verify  k_r in [0, num_drafted_r], the verified prefix length of request r
  load        requests that sample this step (N_s) and non-draft tokens already scheduled (T)
Policies implement the `VerifyPolicy` protocol and live in `POLICIES`, looked up by name. The step's
types (DraftBatch, Load, Groups, StepPlan, VerifyOutcome) live in avkit/step_types.py. The engine hands
a policy one step (`Load`); the simulator many steps at once (`Groups`, one group per step), and the
same policy object decides both. On a command line a policy is a spec (`parse_spec`):
  full                     verify every draft
  nospec, fixed:K          draft and verify K (0: target-only decoding)
  adaptive[-stop][-nogate][:ESTIMATOR]
                           budgeted verification (scheduling/adaptive.py) of K drafts; -stop also stops
                           drafting early (what avkit's engine runs by default), -nogate never skips drafting
  schedule:FILE            K by batch size (`avkit tune`'s schedule, scheduling/batch_schedule.py)
  NAME                     any other policy registered in POLICIES (a plug-in), made without arguments
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import torch

from avkit.config import AdaptiveConfig
from avkit.errors import ConfigError
from avkit.registry import Registry
from avkit.step_types import DraftBatch, Groups, Load, StepPlan, StepTime, VerifyOutcome


class VerifyPolicy(Protocol):
    """The contract between the engine and a verify policy: policies subclass it, inheriting the
    optional hooks' defaults, so the engine calls every hook unconditionally (no attribute probing)."""

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
        """The simulator's `draft_this_step`: [G] bool, which steps draft, decided in step order, each from
        earlier steps only (`batch`: the drafts every step would propose); None (default): every step."""
        return None

    def draft_limits(self, load: Load | Groups, lag: list[int] | None, remaining: list[int] | None):
        """Before drafting: per request ([B] list or tensor) the most drafts it may propose this step, from
        host counts no draw decides (lag: tokens its drafter has not seen; remaining: new tokens it may
        still emit; both [B], None for `Groups`); None (default): no limit beyond the engine's K."""
        return None

    def confidence_coefficients(self, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(slope [1], intercepts [K]) on `device` for the confidence kernel in each draft pass, when
        the policy's predictions are sigma(slope * logit(q_max) + intercept_i); None (default): the
        policy predicts from the features itself."""
        return None

    def continue_drafting(self, batch: DraftBatch, load: Load | Groups) -> torch.Tensor | None:
        """After each pass of an autoregressive drafter: [B] bool "draft one more" from the lossless
        features so far (DraftBatch name -> [B, j]), or None: no early stop (default)."""
        return None

    def observe_step_time(self, timing: StepTime) -> float | None:
        """After a step, its shape and wall time (a policy may learn its cost model from them); returns the
        step's actual / predicted ms, or None (default) when the policy predicts none."""
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


# name -> factory(**kwargs) -> VerifyPolicy; "adaptive" is imported the first time it is looked up.
POLICIES = Registry("verify policy", {
    "full": FullVerification,
    "fixed": FixedK,
    "adaptive": "avkit.scheduling.adaptive:make_adaptive",
    "schedule": "avkit.scheduling.batch_schedule:make_scheduled",
})


ADAPTIVE_HEADS = {"adaptive": (False, True), "adaptive-stop": (True, True), "adaptive-nogate": (False, False),
                  "adaptive-stop-nogate": (True, False)}  # spec head -> (stop drafting early, draft gate)
SPEC_HELP = "full, nospec, fixed:K, adaptive[-stop][-nogate]:ESTIMATOR, schedule:FILE"


@dataclass(frozen=True)
class PolicySpec:
    """A policy named on a command line (module note): its POLICIES entry and argument."""

    text: str  # as typed
    name: str  # the POLICIES entry
    arg: str = ""  # K, ESTIMATOR or FILE
    stop_drafting: bool = False  # adaptive: also stop drafting early
    gate: bool = True  # adaptive: the draft gate

    @property
    def label(self) -> str:
        """The policy's name in results: nospec, fixedK, adaptive[-stop][-nogate]-ESTIMATOR, schedule-STEM, full."""
        if self.name == "fixed":
            return f"fixed{self.arg}" if self.arg != "0" else "nospec"
        if self.name == "adaptive":
            return f"adaptive{'-stop' if self.stop_drafting else ''}{'' if self.gate else '-nogate'}-{self.arg}"
        return f"schedule-{Path(self.arg).stem}" if self.name == "schedule" else self.name

    def make(self, *, k: int, cost=None, adaptive: AdaptiveConfig | None = None, estimator=None,
             **kwargs) -> VerifyPolicy:
        """The live policy object for an engine (or a simulator) drafting up to `k`; adaptive's `cost` table
        and settings, `estimator` an estimator object instead of the spec's name (the simulator's sources)."""
        if self.name == "fixed":
            return POLICIES.make("fixed", k=int(self.arg))
        if self.name == "schedule":
            return POLICIES.make("schedule", schedule=self.arg, k=k)
        if self.name != "adaptive":  # full, or a registered plug-in policy
            return POLICIES.make(self.name)
        config = replace(adaptive or AdaptiveConfig(), estimator=self.arg, stop_drafting=self.stop_drafting,
                         draft_gate=self.gate and (adaptive or AdaptiveConfig()).draft_gate)
        return POLICIES.make("adaptive", cost=cost, estimator=estimator if estimator is not None else self.arg,
                             k=k, adaptive=config, **kwargs)


def parse_spec(text: str, option: str = "--policy", bare: tuple[str, ...] = (), estimator: str = "") -> PolicySpec:
    """A PolicySpec from `HEAD[:ARG]` (module note); one ConfigError line naming `option` and the text.
    `bare`: heads that may come without their argument (arg "" then: the caller supplies it; simulate expands
    a bare `fixed` to every K, serve takes -k and --schedule); a bare adaptive head means `estimator`
    (default: AdaptiveConfig's)."""
    head, _, arg = text.strip().partition(":")
    where = f"{option} {text}"
    if head in ("full", "nospec") and not arg:
        return PolicySpec(text, "full") if head == "full" else PolicySpec(text, "fixed", "0")
    if head == "fixed" and (arg.isdigit() or (head in bare and not arg)):
        return PolicySpec(text, "fixed", str(int(arg)) if arg else "")
    if head == "fixed":
        raise ConfigError(f"{where}: fixed:K needs a non-negative integer K")
    if head in ADAPTIVE_HEADS:
        stop, gate = ADAPTIVE_HEADS[head]
        return PolicySpec(text, "adaptive", arg or estimator or AdaptiveConfig().estimator, stop, gate)
    if head == "schedule" and (arg or head in bare):
        return PolicySpec(text, "schedule", arg)
    if head in POLICIES and head not in ("fixed", "schedule", "adaptive") and not arg:  # a plug-in, by name
        return PolicySpec(text, head)
    raise ConfigError(f"{where}: unknown policy; choose from {SPEC_HELP}")
