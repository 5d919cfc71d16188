"""The simulator's step loop: per concurrency a fresh policy object (as a server starts one) decides every sim
step through the engine's hooks (scheduling/policy.py) with `Groups`, one group per sim step. An adaptive
policy's estimator runs in refit rounds (estimators/rounds.py) and learns the round's observed slots, as live.
A step's drafting costs the passes that ran and the drafter's catch-up on tokens decoded without it
(`catch_up_ms`). Replay-only confidence sources read whole slot columns and size b* from themselves (a bound):
`oracle` (1 where the trace accepted: not lossless) and `recorded` (the trace's `confidence` column).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from avkit.config import AdaptiveConfig
from avkit.errors import ConfigError
from avkit.estimators.coefficients import estimator_feature, load_estimator
from avkit.estimators.base import Estimator, Passthrough
from avkit.estimators.rounds import replay_steps
from avkit.scheduling.batch_schedule import BatchSchedule
from avkit.scheduling.cost import CostTable
from avkit.scheduling.policy import VerifyPolicy
from avkit.scheduling.spec import ADAPTIVE, PolicySpec, parse_spec
from avkit.sim.steps import Replay, StepTable
from avkit.step_types import DraftBatch, Groups
from avkit.trace import labels as label_rule


class Column(Passthrough):
    """A confidence source that reads a whole slot's column (`oracle`, `recorded`) as the prediction."""

    per_position = False  # cannot predict position j from position 0 (AdaptiveVerification.sizing)

    def __init__(self, name: str, feature: str, lossless: bool, k: int):
        super().__init__(k)
        self.name, self.feature, self.lossless = name, feature, lossless


SOURCES = {"oracle": ("oracle", False), "recorded": ("confidence", True)}  # name -> (feature, lossless)


@dataclass(frozen=True)
class SimPolicy:
    """A policy spec as the simulator runs it: the live object made fresh per replay, warm-started."""

    spec: PolicySpec
    coefficients: str = ""  # adaptive: warm start file
    burn_in: bool = True  # adaptive, no file: start from a pass over the traces (`burn_in`)
    warm_state: dict | None = None  # the estimator's state after burn-in (set by `prepare`)
    adaptive: AdaptiveConfig | None = None  # adaptive: gate settings (None: the defaults, as live)

    @property
    def name(self) -> str:
        return self.spec.label

    @property
    def estimator(self) -> str:
        return self.spec.arg if self.spec.name in ADAPTIVE else ""

    @property
    def lossless(self) -> bool:
        """The oracle reads the outcomes; an estimator is lossless iff its feature is."""
        if self.estimator in SOURCES:
            return SOURCES[self.estimator][1]
        return not self.estimator or bool(getattr(load_estimator(self.estimator, k=1), "lossless", True))

    def draft_len(self, k: int) -> int:
        """Drafts proposed per request and step at most."""
        if self.spec.name == "fixed":
            return min(int(self.spec.arg), k)
        if self.spec.name == "schedule":
            return min(BatchSchedule.load(self.spec.arg).max_k, k)
        return k

    def make(self, steps: StepTable, cost: CostTable) -> VerifyPolicy:
        source = Column(self.estimator, *SOURCES[self.estimator], steps.k) if self.estimator in SOURCES else None
        if source is not None:
            _feature(source, steps)  # the trace must hold the source's column
        policy = self.spec.make(k=steps.k, cost=cost, adaptive=self.adaptive, coefficients=self.coefficients,
                                bound=True, estimator=source)
        if self.warm_state is not None:
            policy.estimator.load_state_dict(self.warm_state)
        return policy

    def prepare(self, steps: StepTable) -> SimPolicy:
        """Burn a named online estimator in on the traces once (not for sources or a coefficients file)."""
        if not self.estimator or self.estimator in SOURCES or self.coefficients or not self.burn_in:
            return self
        est = load_estimator(self.estimator, k=steps.k)
        if est is None:
            return self
        burn_in(est, steps, _feature(est, steps))
        return replace(self, warm_state=est.state_dict())


def parse_policies(specs, k: int, coefficients: str = "", burn_in: bool = True) -> list[SimPolicy]:
    """Policy specs (scheduling/spec.py; a bare `fixed` is every K = 1..k) -> the simulator's policies."""
    out = []
    for text in specs:
        spec = parse_spec(text, bare=("fixed",))
        if spec.name == "fixed" and not spec.arg:
            out += [SimPolicy(parse_spec(f"fixed:{i}")) for i in range(1, k + 1)]
        else:
            out.append(SimPolicy(spec, coefficients, burn_in))
    return out


def _feature(est, steps: StepTable) -> str:
    name = estimator_feature(est)
    if name not in steps.features and name != "oracle":
        raise ConfigError(f"simulate: estimator {getattr(est, 'name', est)!r} needs trace column {name!r}")
    return name


def decide(policy: VerifyPolicy, replay: Replay) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(verify counts [S'], drafts proposed [S'], drafting ms [G]) of `policy` over every sim step."""
    sched = replay.sched
    groups = Groups(torch.from_numpy(sched.group.astype(np.int64)), torch.from_numpy(replay.num_requests))
    wanted = replay.steps.drafted[sched.rows]  # [S'] what the recorded engine drafted (its K, its length caps)
    limits = policy.draft_limits(groups, None, None)
    if limits is not None:
        wanted = np.minimum(wanted, np.asarray(limits))
    est = getattr(policy, "estimator", None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the step loop's tensors are tiny: intra-op threads only add hand-offs (the default
    try:  # simulation on the shipped traces: 12x the CPU time with 2 threads on a busy 2-core box)
        k, drafted, draft_ms = _step(policy, replay.cost, {}, "", wanted, groups) if est is None else \
            _rounds(policy, est, replay, wanted, groups)
    finally:
        torch.set_num_threads(threads)
    return k, drafted, draft_ms + catch_up_ms(replay, drafted > 0)


def _rounds(policy, est, replay: Replay, wanted: np.ndarray, groups: Groups):
    """An adaptive policy, one estimator round at a time (estimators/rounds.py)."""
    steps, bounds, rows = replay.steps, replay.bounds, replay.sched.rows
    feature = _feature(est, steps)
    k = steps.k
    labels, acc = steps.label[rows], steps.accepted[rows]  # [S', K], [S']
    j = np.arange(k)[None, :]
    # [S', K] the feature; the oracle's column: 1 where the trace accepted the draft
    feats = (j < acc[:, None]).astype(np.float64) if feature == "oracle" else steps.features[feature][rows]
    out, drafted = np.zeros(rows.size, np.int64), np.zeros(rows.size, np.int64)
    draft_ms = np.zeros(replay.num_requests.size)

    def round_(conf, g0: int, g1: int):
        r0, r1 = bounds[g0], bounds[g1]
        sub = Groups(groups.group[r0:r1] - g0, groups.num_requests[g0:g1])
        f = torch.from_numpy(feats[r0:r1]).float()  # [n, K] as the engine's drafter gives them
        on = policy.draft_steps(DraftBatch({feature: f}, torch.from_numpy(wanted[r0:r1])), sub)
        on = np.ones(g1 - g0, bool) if on is None else on.numpy()
        w = np.where(on[sub.group.numpy()], wanted[r0:r1], 0)
        out[r0:r1], drafted[r0:r1], draft_ms[g0:g1] = _step(policy, replay.cost, {feature: f}, feature, w, sub)
        observed = label_rule.observed(j, out[r0:r1, None], acc[r0:r1, None]) & (labels[r0:r1] >= 0)  # [n, K]
        return observed.ravel(), on

    pos = np.tile(np.arange(k), rows.size)  # [S' * K]
    replay_steps(est, np.nan_to_num(feats, nan=0.0).ravel(), pos, labels.ravel(), bounds * k, round_)
    return out, drafted, draft_ms


def _step(policy, cost: CostTable, feats: dict, feature: str, wanted: np.ndarray, groups: Groups):
    """Draft (pass by pass while the policy stops drafting early) and verify some steps: (verify counts,
    drafts proposed [rows], drafting ms [G])."""
    group, n = groups.group.numpy(), groups.num_requests.numpy()
    t = torch.from_numpy
    keep = None
    if feature and cost.drafter == "autoregressive" and wanted.any():
        keep = policy.continue_drafting(DraftBatch({feature: feats[feature][:, :1]}, t(np.minimum(wanted, 1))),
                                        groups)
    if keep is None:  # every request drafts what it wanted: the step's deepest draft sets the passes
        proposed = wanted
        passes = np.zeros(n.size, np.int64)
        np.maximum.at(passes, group, wanted)
        draft_ms = cost.draft_cost(n, passes)
    else:  # an autoregressive drafter, pass by pass over the requests still drafting
        proposed, active, depth = np.minimum(wanted, 1), wanted > 0, 1
        draft_ms = np.zeros(n.size)
        while True:
            n_active = np.bincount(group[active], minlength=n.size)  # [G]
            draft_ms += (cost.draft_pass_cost(n_active) + (cost.draft_fixed_cost(n_active) if depth == 1 else 0.0)) \
                * (n_active > 0)
            active = keep.numpy() & (wanted > proposed)
            if not active.any():
                break
            proposed, depth = proposed + active, depth + 1
            if (wanted > proposed).any():  # the engine asks only while a deeper pass may follow
                keep = policy.continue_drafting(DraftBatch({feature: feats[feature][:, :depth]}, t(proposed)),
                                                groups)
            else:
                keep = torch.zeros(len(proposed), dtype=torch.bool)
    plan = policy.num_verify(DraftBatch(feats, t(proposed)), groups)
    return plan.num_verify.numpy(), proposed, draft_ms


def stale_tokens(copy: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """[S'] tokens each row's request decoded without the drafter since its last drafted step (or since
    it started), for rows that draft ([S'] bool drafts; rows in sim-step order, `copy` [S'] their request)."""
    order = np.lexsort((np.arange(copy.size), copy))  # each copy's rows in time order
    c, d = copy[order], drafts[order]
    i = np.arange(c.size)
    start = np.maximum.accumulate(np.where(np.r_[True, c[1:] != c[:-1]], i, 0)) if c.size else i
    last = np.maximum.accumulate(np.where(d, i, -1))  # latest drafting row at or before i
    prev = np.r_[-1, last[:-1]]  # latest drafting row before i
    stale = np.zeros(copy.size, dtype=np.int64)
    stale[order] = np.where(d, i - np.maximum(prev + 1, start), 0)
    return stale


def catch_up_ms(replay: Replay, drafts: np.ndarray) -> np.ndarray:
    """[G] drafter ms at each drafting sim step for its requests' tokens decoded without it: `catch_up_cost` of a
    drafter `stale + 1` tokens behind, as live (one step without drafting leaves a free lag of 2)."""
    stale = stale_tokens(replay.sched.copy, drafts)  # [S']
    ms = np.where(stale > 0, replay.cost.catch_up_cost(stale + 1), 0.0)  # [S']
    return np.bincount(replay.sched.group, weights=ms, minlength=replay.num_requests.size)  # [G]


# Burn-in: the traces replayed in recorded engine-step order (without one: 8 step rows a step), labels as
# recorded, through estimators/rounds.py until `min_refits` refit rounds: the state a live estimator reaches.
def burn_in(est: Estimator, steps: StepTable, feature: str, min_refits: int = 20, max_passes: int = 50) -> None:
    """Replay the traces' recorded outcomes through `est` in engine-step order until `min_refits` refits
    (at most `max_passes` passes)."""
    s, k = steps.request.size, steps.k
    known = (steps.engine_step >= 0).all()
    order = np.argsort(steps.engine_step, kind="stable") if known else np.arange(s)
    eng = steps.engine_step[order] if known else np.arange(s) // 8
    bounds = np.r_[np.flatnonzero(np.r_[True, eng[1:] != eng[:-1]]), s] * k  # [G+1] first slot of each step
    feats = np.nan_to_num(steps.features[feature][order], nan=0.0).ravel()  # [S * K]
    labels = steps.label[order].ravel()  # [S * K] -1 censored
    pos = np.tile(np.arange(k), s)
    refits, passes = [], 0  # [rounds] whether each refit
    while sum(refits) < min_refits and passes < max_passes:
        replay_steps(est, feats, pos, labels, bounds, on_round=lambda g, refit: refits.append(refit))
        passes += 1
