"""Verify policies as the simulator runs them: whole schedules at once instead of step by step
(the adaptive one in sim/adaptive.py).

Glossary:
  draft_len   drafts proposed per request and step (fixed K' drafts K', adaptive drafts the recorded K)
  source      where adaptive confidences come from: an estimator in ESTIMATORS (refit online as the
              replay goes, exactly as live), `oracle` (1 for drafts the trace accepted, else 0) or
              `recorded` (the trace's own `confidence` column, from the estimator that ran live)
  stop        `adaptive-stop:SOURCE` also decides the draft length: an autoregressive drafter pays one
              forward per depth, so the plain budget cannot save drafting (vLLM notes MTP/EAGLE gain
              less from AV for this reason); this variant stops a request's drafting once its newest
              draft is trimmed or its next one would not pay for itself at the step's current rate
  gate        as live (scheduling/gate.py): before each sim step the policy may skip drafting when, at
              that load, its own step replayed on the recent drafted rows' sizing confidences would
              not pay on the cost table; skipped steps verify nothing, emit one token per request
              and feed the estimator nothing (live: no drafts, no `observe`); the next step that
              drafts also pays the drafter's catch-up on the tokens its requests decoded meanwhile
              (`catch_up_ms`: one forward over them, priced as a draft pass of that many rows)
  sizing      as live (AdaptiveVerification.sizing): an estimator source sizes b* from each request's
              position-0 feature predicted at every position and K nominal drafts (draw-independent,
              so lossless), then verifies the top-b* live slots. `oracle` and `recorded` have no
              estimator to re-predict with and size b* from their own confidences: upper bounds.
Policies are named by specs: `nospec`, `fixed:K` (or `fixed` = 1..recorded K), `adaptive:SOURCE`,
`adaptive-stop:SOURCE` (and `adaptive-nogate:SOURCE`, `adaptive-stop-nogate:SOURCE` without the gate),
looked up in SIM_POLICIES by the part before the colon.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from avkit.errors import ConfigError
from avkit.sim.adaptive import Adaptive
from avkit.sim.steps import Replay, SimPolicy, StepTable


@dataclass(frozen=True)
class NoSpec:
    name: str = "nospec"
    estimator: str = ""
    lossless: bool = True

    def draft_len(self, k: int) -> int:
        return 0

    def prepare(self, steps: StepTable) -> NoSpec:
        return self

    def decide(self, replay: Replay):
        zero = np.zeros(replay.sched.rows.size, dtype=np.int64)
        return zero, zero, np.zeros(replay.sched.num_groups)


@dataclass(frozen=True)
class Fixed:
    k: int
    estimator: str = ""
    lossless: bool = True

    @property
    def name(self) -> str:
        return f"fixed{self.k}"

    def draft_len(self, k: int) -> int:
        return min(self.k, k)

    def prepare(self, steps: StepTable) -> Fixed:
        return self

    def decide(self, replay: Replay):
        drafted = replay.drafted(self.k)
        return drafted, drafted, replay.cost.draft_cost(replay.num_requests, replay.draft_passes(self.k))


def _fixed(arg: str, k: int, coefficients: str, burn: bool) -> list[SimPolicy]:
    if not arg:
        return [Fixed(i) for i in range(1, k + 1)]
    if not arg.isdigit() or int(arg) < 1:
        raise ConfigError(f"policy fixed:K needs a positive integer K, got {arg!r}")
    return [Fixed(int(arg))]


# spec head -> factory(argument, recorded K, coefficients path, burn-in) -> policies
SIM_POLICIES: dict[str, Callable[[str, int, str, bool], list[SimPolicy]]] = {
    "nospec": lambda arg, k, coef, burn: [NoSpec()],
    "fixed": _fixed,
    "adaptive": lambda arg, k, coef, burn: [Adaptive(arg or "online_logistic", coef, burn_in=burn)],
    "adaptive-stop": lambda arg, k, coef, burn: [Adaptive(arg or "online_logistic", coef, True, burn_in=burn)],
    # without the draft gate: speculation never switched off (what the gate adds, measured)
    "adaptive-nogate": lambda arg, k, coef, burn: [Adaptive(arg or "online_logistic", coef, burn_in=burn, gate=None)],
    "adaptive-stop-nogate": lambda arg, k, coef, burn: [Adaptive(arg or "online_logistic", coef, True, burn_in=burn,
                                                                 gate=None)],
}


def parse_policies(specs, k: int, coefficients: str = "", burn_in: bool = True) -> list[SimPolicy]:
    """Policy specs (`nospec`, `fixed`, `fixed:3`, `adaptive:online`, `adaptive:oracle`, ...) -> policies."""
    out: list[SimPolicy] = []
    for spec in specs:
        head, _, arg = spec.partition(":")
        if head not in SIM_POLICIES:
            raise ConfigError(f"unknown simulate policy {spec!r}; choose from {sorted(SIM_POLICIES)}")
        out.extend(SIM_POLICIES[head](arg, k, coefficients, burn_in))
    return out
