"""Live estimator coefficients: published after refits, snapshotted to a file atomically through `SideWrites`
(docs/runtime.md, "Serving")."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from avkit.estimators.coefficients import ServedPair, coefficients_document
from avkit.serve.side_writes import SideWrites
from avkit.staged import write_json_atomic

log = logging.getLogger("avkit.serve")

COST_SNAPSHOT = "learned_cost.json"  # beside the coefficients snapshot


def cache_snapshot_of(path: Path) -> Path:
    """The cache estimator's snapshot beside the model estimator's: coefficients.json -> coefficients.cache.json."""
    return path.with_name(f"{path.stem}.cache{path.suffix or '.json'}")


def coefficients_of(estimator, pair: ServedPair | None = None, drafter: str = "model") -> dict[str, Any] | None:
    """Estimator state -> coefficients.json dict (None when the estimator has no slope/intercepts), mode
    "online", `trained_on` naming this server, the snapshot time, the served `pair` and (`drafter`
    "suffix": the hybrid drafter's cache rows) the rows it scored."""
    return coefficients_document(estimator, {
        "source": "avkit serve", "snapshot_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(asdict(pair) if pair is not None else {}), **({"drafter": drafter} if drafter != "model" else {})},
        mode="online")


class Snapshots:
    """Publishes coefficients after each refit; writes `path` (and the cache estimator's beside it) every
    `every` refits, the learned cost model (the adaptive policy's `learner`) to COST_SNAPSHOT beside it every
    `cost_every` learned steps, and both at `close`, each through `side_writes` (kinds "snapshot", "cost")."""

    def __init__(self, policy, path: Path | None, every: int, pair: ServedPair | None, side_writes: SideWrites,
                 cost_every: int = 512):
        self.side_writes = side_writes
        self._policy, self._pair = policy, pair
        self._estimator = getattr(policy, "estimator", None)  # only the adaptive policy has one (and counts refits)
        self.learner = getattr(policy, "learner", None)  # only the adaptive policy learns its cost
        self.path, self.every, self.cost_every = path, every, cost_every
        self.refits = 0  # refit rounds seen since start
        self.cache_refits = 0  # the cache estimator's (hybrid drafter), counted apart
        self._last_written = 0  # refits + cache_refits at the last write
        self._current = self._read()

    def current(self) -> dict[str, Any] | None:
        return self._current

    def on_step(self) -> None:
        """Engine thread, after each step: publish after a refit; snapshot every `every` refits (of either
        estimator); the cost model every `cost_every` learned steps."""
        if self.learner is not None and self.learner.steps and self.learner.steps % self.cost_every == 0:
            self.side_writes.run("cost", self.write_cost)
        if self._estimator is None:
            return
        refits, cache_refits = self._policy.refits, self._policy.cache_refits
        if (refits, cache_refits) == (self.refits, self.cache_refits):
            return
        self.refits, self.cache_refits = refits, cache_refits
        self._current = self._read()
        if self.refits + self.cache_refits - self._last_written >= self.every:
            self.side_writes.run("snapshot", self.write)

    def close(self) -> None:
        """Write both now (shutdown); never raises: each failure is the side writes' to report."""
        self.side_writes.run("snapshot", self.write, force=True)
        self.side_writes.run("cost", self.write_cost, force=True)

    def write(self) -> None:
        coeffs = self._read()
        if self.path is None or coeffs is None:
            return
        cache = self._read("suffix")
        if cache is not None:
            write_json_atomic(cache_snapshot_of(self.path), cache)
        write_json_atomic(self.path, coeffs)
        self._last_written = self.refits + self.cache_refits
        log.info("coefficients snapshot -> %s%s (refit %d)", self.path,
                 f" and {cache_snapshot_of(self.path).name}" if cache is not None else "", self.refits)

    def write_cost(self) -> None:
        if self.learner is None or self.path is None:
            return
        self.learner.snapshot(self.path.with_name(COST_SNAPSHOT))
        log.info("learned cost model -> %s (%d steps)", self.path.with_name(COST_SNAPSHOT), self.learner.steps)

    def _read(self, drafter: str = "model") -> dict[str, Any] | None:
        """The model estimator's snapshot (`drafter` "suffix": the cache estimator's), with its refit count."""
        estimator, refits = (self._estimator, self.refits) if drafter == "model" else \
            (self._policy.cache_estimator, self.cache_refits)
        c = coefficients_of(estimator, self._pair, drafter) if estimator is not None else None
        if c is not None:
            c["refits"] = refits  # refits of this server process
        return c
