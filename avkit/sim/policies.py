"""Verify policies as the simulator runs them: whole schedules at once instead of step by step.

Glossary:
  draft_len   drafts proposed per request and step (fixed K' drafts K', adaptive drafts the recorded K)
  source      where adaptive confidences come from: an estimator in ESTIMATORS (refit online as the
              replay goes, exactly as live), `oracle` (1 for drafts the trace accepted, else 0) or
              `recorded` (the trace's own `confidence` column, from the estimator that ran live)
Policies are named by specs: `nospec`, `fixed:K` (or `fixed` = 1..recorded K), `adaptive:SOURCE`,
looked up in SIM_POLICIES by the part before the colon.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from avkit.errors import ConfigError
from avkit.scheduling.adaptive import estimator_feature, load_estimator
from avkit.scheduling.cost import CostTable
from avkit.sim.allocate import grouped_budget
from avkit.sim.steps import Schedule, StepTable


@dataclass(frozen=True)
class Replay:
    """One concurrency's schedule with the per-step quantities every policy needs."""

    steps: StepTable
    sched: Schedule
    cost: CostTable
    bounds: np.ndarray  # [G+1] first schedule row of each sim step
    num_requests: np.ndarray  # [G] requests in each sim step (N_s = T = this: all decoding, no prefill)

    @classmethod
    def build(cls, steps: StepTable, sched: Schedule, cost: CostTable) -> Replay:
        bounds = np.searchsorted(sched.group, np.arange(sched.num_groups + 1))
        return cls(steps, sched, cost, bounds, np.diff(bounds))

    def drafted(self, draft_len: int) -> np.ndarray:  # [S'] drafts per row under a draft length
        return np.minimum(self.steps.drafted[self.sched.rows], draft_len)

    def draft_passes(self, draft_len: int) -> np.ndarray:  # [G] drafter forwards per sim step
        d = self.drafted(draft_len)
        return np.maximum.reduceat(d, self.bounds[:-1]) if d.size else np.zeros(0, np.int64)


class SimPolicy(Protocol):
    name: str
    estimator: str

    def draft_len(self, k: int) -> int: ...

    def verify_counts(self, replay: Replay) -> np.ndarray: ...  # [S'] int64


@dataclass(frozen=True)
class NoSpec:
    name: str = "nospec"
    estimator: str = ""

    def draft_len(self, k: int) -> int:
        return 0

    def verify_counts(self, replay: Replay) -> np.ndarray:
        return np.zeros(replay.sched.rows.size, dtype=np.int64)


@dataclass(frozen=True)
class Fixed:
    k: int
    estimator: str = ""

    @property
    def name(self) -> str:
        return f"fixed{self.k}"

    def draft_len(self, k: int) -> int:
        return min(self.k, k)

    def verify_counts(self, replay: Replay) -> np.ndarray:
        return replay.drafted(self.k)


@dataclass(frozen=True)
class Adaptive:
    estimator: str  # estimator name, "oracle" or "recorded"
    coefficients: str = ""
    chunk: int = 100  # sim steps predicted per estimator call (re-predicted after every refit)

    @property
    def name(self) -> str:
        return f"adaptive-{self.estimator}"

    def draft_len(self, k: int) -> int:
        return k

    def verify_counts(self, replay: Replay) -> np.ndarray:
        if self.estimator in STATIC_SOURCES:
            conf = STATIC_SOURCES[self.estimator](replay)
            return self._budget(replay, conf, 0, replay.sched.num_groups)
        return self._online(replay)

    def _budget(self, replay: Replay, conf: np.ndarray, g0: int, g1: int) -> np.ndarray:
        """Verify counts of the rows of sim steps [g0, g1) given their confidences [rows, K]."""
        r0, r1 = replay.bounds[g0], replay.bounds[g1]
        k = replay.steps.k
        n = replay.num_requests[g0:g1]
        fixed = replay.cost.fixed_cost(n, replay.draft_passes(k)[g0:g1])
        return grouped_budget(replay.sched.group[r0:r1] - g0, conf, replay.drafted(k)[r0:r1],
                              num_sampling=n, num_scheduled=n, fixed_ms=fixed, verify_ms=replay.cost.verify_cost)

    def _online(self, replay: Replay) -> np.ndarray:
        """Predict a chunk, decide it, feed each step's observed slots; after a refit, re-predict the rest."""
        est = load_estimator(self.estimator, self.coefficients)
        steps, rows, bounds = replay.steps, replay.sched.rows, replay.bounds
        name = estimator_feature(est)
        if name not in steps.features:
            raise ConfigError(f"simulate: estimator {self.estimator!r} needs trace column {name!r}")
        feats = np.nan_to_num(steps.features[name][rows], nan=0.0)  # [S', K]
        labels, acc = steps.label[rows], steps.accepted[rows]  # [S', K], [S']
        k = steps.k
        pos = np.broadcast_to(np.arange(k), feats.shape)  # [S', K]
        out = np.zeros(rows.size, dtype=np.int64)
        g0, groups = 0, replay.sched.num_groups
        while g0 < groups:
            g1 = min(groups, g0 + self.chunk)
            r0, r1 = bounds[g0], bounds[g1]
            conf = np.asarray(est.predict(feats[r0:r1].ravel(), pos[r0:r1].ravel())).reshape(-1, k)
            out[r0:r1] = self._budget(replay, conf, g0, g1)
            j = np.arange(k)[None, :]
            observed = (j < out[r0:r1, None]) & (j <= acc[r0:r1, None]) & (labels[r0:r1] >= 0)  # DESIGN §3
            next_g = g1
            for g in range(g0, g1):  # one update per engine step, as live
                a, b = bounds[g] - r0, bounds[g + 1] - r0
                o = observed[a:b]
                if est.update(feats[r0 + a:r0 + b][o], pos[r0 + a:r0 + b][o], conf[a:b][o],
                              (labels[r0 + a:r0 + b][o] == 1).astype(np.float64)):
                    next_g = g + 1  # coefficients changed: later steps of this chunk re-predict
                    break
            g0 = next_g
        return out


def _oracle(replay: Replay) -> np.ndarray:
    acc = replay.steps.accepted[replay.sched.rows]
    return (np.arange(replay.steps.k)[None, :] < acc[:, None]).astype(np.float64)  # knows the outcomes


def _recorded(replay: Replay) -> np.ndarray:
    if "confidence" not in replay.steps.features:
        raise ConfigError("simulate: adaptive:recorded needs a non-null `confidence` column in the traces")
    return replay.steps.features["confidence"][replay.sched.rows]


STATIC_SOURCES: dict[str, Callable[[Replay], np.ndarray]] = {"oracle": _oracle, "recorded": _recorded}


def _fixed(arg: str, k: int, coefficients: str) -> list[SimPolicy]:
    if not arg:
        return [Fixed(i) for i in range(1, k + 1)]
    if not arg.isdigit() or int(arg) < 1:
        raise ConfigError(f"policy fixed:K needs a positive integer K, got {arg!r}")
    return [Fixed(int(arg))]


SIM_POLICIES: dict[str, Callable[[str, int, str], list[SimPolicy]]] = {
    "nospec": lambda arg, k, coef: [NoSpec()],
    "fixed": _fixed,
    "adaptive": lambda arg, k, coef: [Adaptive(arg or "online", coef)],
}


def parse_policies(specs, k: int, coefficients: str = "") -> list[SimPolicy]:
    """Policy specs (`nospec`, `fixed`, `fixed:3`, `adaptive:online`, `adaptive:oracle`, ...) -> policies."""
    out: list[SimPolicy] = []
    for spec in specs:
        head, _, arg = spec.partition(":")
        if head not in SIM_POLICIES:
            raise ConfigError(f"unknown simulate policy {spec!r}; choose from {sorted(SIM_POLICIES)}")
        out.extend(SIM_POLICIES[head](arg, k, coefficients))
    return out
