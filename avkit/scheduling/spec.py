"""Policy names and specs: the `POLICIES` registry and the one `--policy` parser (torch-free at import).

A spec `HEAD[:ARG]` means the same policy in `avkit serve`, `record`, `simulate` and `tune`'s arms; its
POLICIES entry alone says how it behaves (docs/budget.md "Policy specs"): full, nospec, fixed:K,
adaptive[-stop][-nogate]:ESTIMATOR, schedule:FILE, or any registered plug-in NAME. Entries are lazy
(avkit/registry.py): a bad `--policy` is refused before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from avkit.config import AdaptiveConfig
from avkit.errors import ConfigError
from avkit.registry import Registry

# name -> factory(**kwargs) -> VerifyPolicy (scheduling/policy.py), imported the first time it is looked up
POLICIES = Registry("verify policy", {
    "full": "avkit.scheduling.policy:FullVerification",
    "fixed": "avkit.scheduling.policy:FixedK",
    "adaptive": "avkit.scheduling.adaptive:make_adaptive",
    "adaptive-stop": "avkit.scheduling.adaptive:make_adaptive_stop",
    "schedule": "avkit.scheduling.batch_schedule:make_scheduled",
})
ADAPTIVE = ("adaptive", "adaptive-stop")  # the adaptive entries: they take an estimator, a cost table, settings
# spec head -> (POLICIES entry, draft gate)
ADAPTIVE_HEADS = {"adaptive": ("adaptive", True), "adaptive-stop": ("adaptive-stop", True),
                  "adaptive-nogate": ("adaptive", False), "adaptive-stop-nogate": ("adaptive-stop", False)}
SPEC_HELP = "full, nospec, fixed:K, adaptive[-stop][-nogate]:ESTIMATOR, schedule:FILE"


@dataclass(frozen=True)
class PolicySpec:
    """A policy named on a command line (module note): its POLICIES entry and argument."""

    text: str  # as typed
    name: str  # the POLICIES entry
    arg: str = ""  # K, ESTIMATOR or FILE
    gate: bool = True  # adaptive: the draft gate

    @property
    def label(self) -> str:
        """The policy's name in results: nospec, fixedK, adaptive[-stop][-nogate]-ESTIMATOR, schedule-STEM, full."""
        if self.name == "fixed":
            return f"fixed{self.arg}" if self.arg != "0" else "nospec"
        if self.name in ADAPTIVE:
            return f"{self.name}{'' if self.gate else '-nogate'}-{self.arg}"
        return f"schedule-{Path(self.arg).stem}" if self.name == "schedule" else self.name

    def make(self, *, k: int, cost=None, adaptive: AdaptiveConfig | None = None, estimator=None, **kwargs):
        """The live policy object (a VerifyPolicy) for an engine (or a simulator) drafting up to `k`; adaptive's
        `cost` table and settings, `estimator` an estimator object instead of the spec's name (the simulator's
        sources)."""
        if self.name == "fixed":
            return POLICIES.make("fixed", k=int(self.arg))
        if self.name == "schedule":
            return POLICIES.make("schedule", schedule=self.arg, k=k)
        if self.name not in ADAPTIVE:  # full, or a registered plug-in policy
            return POLICIES.make(self.name)
        base = adaptive or AdaptiveConfig()
        config = replace(base, estimator=self.arg, draft_gate=self.gate and base.draft_gate)
        return POLICIES.make(self.name, cost=cost, estimator=estimator if estimator is not None else self.arg,
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
        name, gate = ADAPTIVE_HEADS[head]
        return PolicySpec(text, name, arg or estimator or AdaptiveConfig().estimator, gate)
    if head == "schedule" and (arg or head in bare):
        return PolicySpec(text, "schedule", arg)
    if head in POLICIES and head not in ("fixed", "schedule") and not arg:  # a plug-in, by name
        return PolicySpec(text, head)
    raise ConfigError(f"{where}: unknown policy; choose from {SPEC_HELP}")
