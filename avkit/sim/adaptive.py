"""The adaptive verify policy as the simulator runs it: whole schedules at once, the live rules'
one implementation (scheduling/plan.py, stop.py, gate.py) over a `group` vector of sim steps.

Glossary:
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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from avkit.config import AdaptiveConfig
from avkit.errors import ConfigError
from avkit.estimators.rounds import replay_steps
from avkit.estimators.named import estimator_feature, load_estimator
from avkit.scheduling.cost import CostTable
from avkit.scheduling.gate import DraftGate
from avkit.scheduling.plan import plan, verify_lookup
from avkit.scheduling.stop import continue_drafting
from avkit.sim.online import burn_in
from avkit.sim.steps import Replay, StepTable


@dataclass(frozen=True)
class Adaptive:
    estimator: str  # estimator name, "oracle" or "recorded"
    coefficients: str = ""
    stop_drafting: bool = False  # also stop the (autoregressive) drafter early, see `_budget_stop`
    burn_in: bool = True  # start online estimators from a pass over the traces (avkit/sim/online.py)
    chunk: int = 100  # sim steps predicted per call for estimators without refit rounds
    warm_state: dict | None = None  # estimator state after burn-in (set by `prepare`)
    gate: AdaptiveConfig | None = AdaptiveConfig()  # the draft gate's settings, as live (None: always draft)

    @property
    def name(self) -> str:
        return f"adaptive{'-stop' if self.stop_drafting else ''}{'-nogate' if self.gate is None else ''}-{self.estimator}"

    @property
    def lossless(self) -> bool:
        """The oracle reads the outcomes; an estimator is lossless iff its feature is."""
        if self.estimator in STATIC_SOURCES:
            return self.estimator != "oracle"
        return bool(getattr(load_estimator(self.estimator, k=1), "lossless", True))

    def draft_len(self, k: int) -> int:
        return k

    def decide(self, replay: Replay):
        if self.estimator in STATIC_SOURCES:
            conf = STATIC_SOURCES[self.estimator](replay)
            on = self._gate(replay, conf, 0, replay.sched.num_groups)[0] if self.gate is not None else None
            k, drafted, draft_ms = self._budget(replay, conf, 0, replay.sched.num_groups, on=on)
        else:
            k, drafted, draft_ms = self._online(replay)
        if self.gate is not None:  # the drafter catches up on what was decoded while the gate was off
            draft_ms = draft_ms + catch_up_ms(replay, drafted > 0)
        return k, drafted, draft_ms

    def make_gate(self, replay: Replay) -> DraftGate | None:
        if self.gate is None:
            return None
        g = self.gate
        return DraftGate(replay.cost, g.gate_window, g.probe_every, g.resume_margin, self.stop_drafting,
                         replay.steps.k)

    def _gate(self, replay: Replay, sizing_conf: np.ndarray, g0: int, g1: int, gate: DraftGate | None = None):
        """Which sim steps in [g0, g1) draft ([g1-g0] bool) and the gate's state before each, from the
        steps' sizing confidences [rows, K] (float32, as live) of the requests that would draft."""
        gate = gate or self.make_gate(replay)
        r0, r1 = replay.bounds[g0], replay.bounds[g1]
        drafts = replay.drafted(replay.steps.k)[r0:r1] > 0  # [rows]
        conf = sizing_conf.astype(np.float32).astype(np.float64)
        return gate.replay(replay.num_requests[g0:g1], conf, replay.bounds[g0:g1 + 1] - r0, drafts)

    def _budget(self, replay: Replay, conf: np.ndarray, g0: int, g1: int, sizing_conf: np.ndarray | None = None,
                on: np.ndarray | None = None):
        """(verify counts, drafts, drafting ms) of sim steps [g0, g1) given their confidences [rows, K].

        sizing_conf: [rows, K] draw-independent confidences that size b* (None: size from `conf`).
        on: [g1-g0] bool, the steps that draft (the gate; None: all)."""
        r0, r1 = replay.bounds[g0], replay.bounds[g1]
        group, n = replay.sched.group[r0:r1] - g0, replay.num_requests[g0:g1]
        drafted = replay.drafted(replay.steps.k)[r0:r1]
        passes = replay.draft_passes(replay.steps.k)[g0:g1]
        if on is not None:  # skipped steps draft nothing
            drafted, passes = np.where(on[group], drafted, 0), np.where(on, passes, 0)
        sizing = None if sizing_conf is None else (sizing_conf, np.where(drafted > 0, replay.steps.k, 0))
        if self.stop_drafting and replay.cost.drafter == "autoregressive":
            return self._budget_stop(replay.cost, conf, group, n, drafted, sizing)
        draft_ms = replay.cost.draft_cost(n, passes)
        k = sim_plan(replay.cost, conf, drafted, group, n, draft_ms + replay.cost.context_cost(n), sizing)
        return k, drafted, draft_ms

    @staticmethod
    def _budget_stop(cost: CostTable, conf, group, n, drafted, sizing=None):
        """Draft pass by pass (autoregressive drafter: a pass forwards only the requests still drafting),
        each pass deciding who drafts on by scheduling/stop.py's rule, drafting paid so far. The budget
        after the last pass is verified; with `sizing` (confidences [rows, K], nominal drafts [rows]) it
        is re-sized as the live policy's `num_verify` does after the passes: from the sizing inputs, at
        the nominal K-pass drafting cost."""
        groups, t = n.size, torch.from_numpy
        active = drafted > 0  # [rows] still drafting
        proposed = np.zeros_like(drafted)  # [rows] drafts so far
        draft_ms, k_out = np.zeros(groups), np.zeros_like(drafted)
        table = verify_lookup(cost.verify_cost, int(n.max(initial=0)) * (conf.shape[1] + 1) + 2)
        while active.any():
            proposed = proposed + active
            n_active = np.bincount(group[active], minlength=groups)  # [G]
            pass_ms = cost.draft_pass_cost(n_active) * (n_active > 0)  # [G] one pass over the active rows
            first = proposed.max(initial=0) == 1  # the first pass also pays the drafting's fixed part
            draft_ms += pass_ms + (cost.draft_fixed_cost(n_active) * (n_active > 0) if first else 0.0)
            keep, p = continue_drafting(
                t(conf), t(proposed), t(active), t(group), groups, num_sampling=t(n), num_scheduled=t(n),
                fixed_ms=t(draft_ms + cost.context_cost(n)), pass_ms=t(pass_ms), n_active=t(n_active),
                verify_ms=table)
            k_out = p.num_verify.numpy()
            active = keep.numpy() & (drafted > proposed)
        if sizing is not None:
            fixed = cost.draft_cost(n, conf.shape[1]) + cost.context_cost(n)
            k_out = sim_plan(cost, conf, proposed, group, n, fixed, sizing)
        return k_out, proposed, draft_ms

    def prepare(self, steps: StepTable) -> Adaptive:
        """Burn the online estimator in on the traces once (skipped for static sources or a coefficients file)."""
        if self.estimator in STATIC_SOURCES or self.coefficients or not self.burn_in:
            return self
        est = load_estimator(self.estimator, k=steps.k)
        burn_in(est, steps, self._feature(est, steps), self.chunk)
        return replace(self, warm_state=est.state_dict())

    def _feature(self, est, steps: StepTable) -> str:
        name = estimator_feature(est)
        if name not in steps.features:
            raise ConfigError(f"simulate: estimator {self.estimator!r} needs trace column {name!r}")
        return name

    def _online(self, replay: Replay):
        """Predict a round, decide it, feed its observed slots (estimators/rounds.py, as `avkit fit`)."""
        steps, rows, bounds = replay.steps, replay.sched.rows, replay.bounds
        k = steps.k
        est = load_estimator(self.estimator, self.coefficients, k=k)
        if self.warm_state is not None:
            est.load_state_dict(self.warm_state)
        feats = np.nan_to_num(steps.features[self._feature(est, steps)][rows], nan=0.0)  # [S', K]
        first = np.repeat(feats[:, :1], k, axis=1).ravel()  # [S' * K] position-0 feature everywhere
        pos = np.tile(np.arange(k), rows.size)  # [S' * K]
        labels, acc = steps.label[rows], steps.accepted[rows]  # [S', K], [S']
        out, drafted = np.zeros(rows.size, dtype=np.int64), np.zeros(rows.size, dtype=np.int64)
        draft_ms = np.zeros(replay.sched.num_groups)
        j = np.arange(k)[None, :]
        gate = self.make_gate(replay)

        def decide(conf, g0, g1):
            r0, r1 = bounds[g0], bounds[g1]  # the estimator cannot change before g1: size with the same one
            sizing = np.asarray(est.predict(first[r0 * k:r1 * k], pos[r0 * k:r1 * k])).reshape(-1, k)
            on = None if gate is None else self._gate(replay, sizing, g0, g1, gate)[0]
            out[r0:r1], drafted[r0:r1], draft_ms[g0:g1] = self._budget(replay, conf.reshape(-1, k), g0, g1,
                                                                       sizing, on)
            observed = (j < out[r0:r1, None]) & (j <= acc[r0:r1, None]) & (labels[r0:r1] >= 0)  # DESIGN §3
            return observed.ravel(), (np.ones(g1 - g0, bool) if on is None else on)

        replay_steps(est, feats.ravel(), pos, labels.ravel(), bounds * k, decide, chunk=self.chunk)
        return out, drafted, draft_ms


def sim_plan(cost: CostTable, conf: np.ndarray, drafted: np.ndarray, group: np.ndarray, n: np.ndarray,
             fixed_ms: np.ndarray, sizing: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """[rows] verify counts of sim steps (groups) by scheduling/plan.py, on CPU tensors that share the arrays'
    memory: every step decodes n requests (N_s = T = n), conf [rows, K], sizing as in `plan`."""
    t = torch.from_numpy
    table = verify_lookup(cost.verify_cost, int(n.max(initial=0)) * (conf.shape[1] + 1) + 1)
    fixed = np.array(np.broadcast_to(np.asarray(fixed_ms, dtype=np.float64), n.shape))
    p = plan(t(conf), t(drafted), t(group), n.size, num_sampling=t(n), num_scheduled=t(n),
             fixed_ms=t(fixed), verify_ms=table,
             sizing=None if sizing is None else (t(sizing[0]), t(sizing[1])))
    return p.num_verify.numpy()


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
    """[G] drafter time spent, at each sim step that drafts, feeding it the tokens of its requests decoded
    while the gate was off: one forward over all of them, priced as a draft pass of that many rows."""
    stale = stale_tokens(replay.sched.copy, drafts)
    tokens = np.bincount(replay.sched.group, weights=stale, minlength=replay.sched.num_groups)  # [G]
    return np.where(tokens > 0, replay.cost.draft_pass_cost(tokens), 0.0)


def _oracle(replay: Replay) -> np.ndarray:
    acc = replay.steps.accepted[replay.sched.rows]
    return (np.arange(replay.steps.k)[None, :] < acc[:, None]).astype(np.float64)  # knows the outcomes


def _recorded(replay: Replay) -> np.ndarray:
    if "confidence" not in replay.steps.features:
        raise ConfigError("simulate: adaptive:recorded needs a non-null `confidence` column in the traces")
    return replay.steps.features["confidence"][replay.sched.rows]


STATIC_SOURCES: dict[str, Callable[[Replay], np.ndarray]] = {"oracle": _oracle, "recorded": _recorded}


__all__ = ["STATIC_SOURCES", "Adaptive", "catch_up_ms", "sim_plan", "stale_tokens"]
