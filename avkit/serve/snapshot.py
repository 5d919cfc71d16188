"""Live estimator coefficients: publish them after refits, snapshot them to a file atomically.

The snapshot has the layout of `avkit fit`'s coefficients.json (schema_version, feature,
num_positions, slope, intercepts, observations, mode, trained_on) plus `refits`, so the file a
server writes is a file a server (or `avkit simulate`) can deploy: a restart resumes from it.
With the hybrid drafter the suffix cache's rows have their own estimator; it is snapshotted beside,
to `cache_snapshot_of(path)` (coefficients.cache.json; `trained_on.drafter` "suffix", the file
`--cache-coefficients` takes), when it exists (it is made when the first cache rows appear).
`trained_on` names the served pair (target, draft and their sha256), so a server never resumes
from another pair's snapshot (estimators/coefficients.py validates every file on load).
The engine thread calls `on_step()` after every step; `/metrics` reads `current()` from any
thread (a new dict is published, never mutated). A failing write (read-only or full disk) goes
through `SideWrites`: counted, logged once, retried at later refits with backoff, never raised.
The cost model the server learns from its own steps (scheduling/learn.py) is snapshotted the same
way, every `every` learned steps and at shutdown, to COST_SNAPSHOT beside the coefficients
(scheduling/cost.py schema, meta.source = "learned": `simulate --cost FILE` and `tune --cost FILE` read it).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from dataclasses import asdict
from typing import Any

from avkit.estimators.coefficients import ServedPair
from avkit.staged import write_json_atomic

log = logging.getLogger("avkit.serve")

COST_SNAPSHOT = "learned_cost.json"  # beside the coefficients snapshot


def estimator_of(policy) -> Any | None:
    """The online estimator behind a verify policy, if it has one (adaptive does; full/fixed do not)."""
    return getattr(policy, "estimator", None) if policy is not None else None


def cache_snapshot_of(path: Path) -> Path:
    """The cache estimator's snapshot beside the model estimator's: coefficients.json -> coefficients.cache.json."""
    return path.with_name(f"{path.stem}.cache{path.suffix or '.json'}")


def coefficients_of(estimator, pair: ServedPair | None = None, drafter: str = "model") -> dict[str, Any] | None:
    """Estimator state -> coefficients.json dict (None when the estimator has no slope/intercepts).

    Keeps every key of the estimator's state (so `load_state_dict` restores it exactly, round
    counter included) and adds the fields of `avkit fit`'s coefficients.json; `drafter` names the
    rows it scored ("suffix": the hybrid drafter's cache rows).
    """
    state = dict(estimator.state_dict())
    if "slope" not in state or "intercepts" not in state:
        return None
    intercepts = [float(b) for b in state["intercepts"]]
    return {
        **state,
        "schema_version": 1,
        "feature": state.get("feature", "logit_qmax"),
        "num_positions": len(intercepts),
        "slope": float(state["slope"]),
        "intercepts": intercepts,
        "observations": [int(n) for n in state.get("observations", [0] * len(intercepts))],
        "mode": "online",
        "estimator": state.get("name", getattr(estimator, "name", "online_logistic")),
        "trained_on": {"source": "avkit serve",
                       "snapshot_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       **(asdict(pair) if pair is not None else {}),
                       **({"drafter": drafter} if drafter != "model" else {})},
    }


class _Guarded:
    """The side-write guard of a snapshot class, which defines `write` and `kind` (`_side_writes`: the guard;
    None: written directly)."""

    kind = ""
    _side_writes = None

    def write_guarded(self, *, force: bool = False) -> bool:
        """`write` through the side-write guard (retried with backoff; `force`: now, at shutdown)."""
        if self._side_writes is None:
            self.write()
            return True
        return self._side_writes.run(self.kind, self.write, force=force)


class CoefficientSnapshots(_Guarded):
    """Publishes coefficients after each refit; writes `path` (and the cache estimator's beside it) every
    `every` refits and at close."""

    kind = "snapshot"

    def __init__(self, policy, path: Path | None, every: int, pair: ServedPair | None = None, side_writes=None):
        self._side_writes = side_writes  # SideWrites: a failing write is counted, backed off, never raised
        self._policy = policy
        self._pair = pair
        self._estimator = estimator_of(policy)
        self.path = path
        self.every = every
        self.refits = 0  # refit rounds seen since start
        self.cache_refits = 0  # the cache estimator's (hybrid drafter), counted apart
        self._last_written = 0  # refits + cache_refits at the last write
        self._current = self._read()

    def current(self) -> dict[str, Any] | None:
        return self._current

    def on_step(self) -> None:
        """Engine thread, after each step: publish after a refit; snapshot every `every` refits (of either
        estimator)."""
        if self._estimator is None:
            return
        refits, cache_refits = self._refit_count(), int(getattr(self._policy, "cache_refits", 0) or 0)
        if (refits, cache_refits) == (self.refits, self.cache_refits):
            return
        self.refits, self.cache_refits = refits, cache_refits
        self._current = self._read()
        if self.refits + self.cache_refits - self._last_written >= self.every:
            self.write_guarded()

    def write(self) -> None:
        if self.path is None or self._estimator is None:
            return
        coeffs = self._read()
        if coeffs is None:
            return
        cache = getattr(self._policy, "cache_estimator", None)
        cache_coeffs = coefficients_of(cache, self._pair, drafter="suffix") if cache is not None else None
        if cache_coeffs is not None:
            cache_coeffs["refits"] = self.cache_refits
            write_json_atomic(cache_snapshot_of(self.path), cache_coeffs)
        write_json_atomic(self.path, coeffs)
        self._last_written = self.refits + self.cache_refits
        log.info("coefficients snapshot -> %s%s (refit %d)", self.path,
                 f" and {cache_snapshot_of(self.path).name}" if cache_coeffs is not None else "", self.refits)

    def _read(self) -> dict[str, Any] | None:
        if self._estimator is None:
            return None
        c = coefficients_of(self._estimator, self._pair)
        if c is not None:
            c["refits"] = self.refits  # refits of this server process
        return c

    def _refit_count(self) -> int:
        """Refit rounds since start: the policy's counter (adaptive keeps one), else the estimator's."""
        for owner, attr in ((self._policy, "refits"), (self._estimator, "num_refits")):
            n = getattr(owner, attr, None)
            if n is not None:
                return int(n)
        return int(self._estimator.state_dict().get("refits", 0))

class CostSnapshots(_Guarded):
    """The learned cost model (the adaptive policy's `learner`), written every `every` learned steps."""

    kind = "cost"

    def __init__(self, policy, path: Path, every: int = 512, side_writes=None):
        self.learner = getattr(policy, "learner", None)  # only the adaptive policy learns its cost
        self.path, self.every, self._side_writes = path, every, side_writes

    def on_step(self) -> None:
        """Engine thread, after each step: a snapshot every `every` learned steps."""
        if self.learner is not None and self.learner.steps % self.every == 0 and self.learner.steps:
            self.write_guarded()

    def write(self) -> None:
        if self.learner is None:
            return
        self.learner.snapshot(self.path)
        log.info("learned cost model -> %s (%d steps)", self.path, self.learner.steps)

