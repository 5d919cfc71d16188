"""Verify policies as the simulator runs them: whole schedules at once instead of step by step
(the adaptive one in sim/adaptive.py).

Glossary:
  draft_len   drafts proposed per request and step (fixed K' drafts K', adaptive drafts the recorded K)
  SOURCE      adaptive's confidences (an estimator, `oracle`, `recorded`), its early stop and its draft
              gate: see sim/adaptive.py
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
            raise ConfigError(f"--policy {spec}: unknown simulate policy {spec!r}; choose from {sorted(SIM_POLICIES)}")
        out.extend(SIM_POLICIES[head](arg, k, coefficients, burn_in))
    return out
