"""The cost model the server learns from its own steps (scheduling/learn.py), snapshotted to a cost file.

Every `every` engine steps and at shutdown the learned model is written atomically (a temp file renamed;
scheduling/cost.py schema, meta.source = "learned") through the side-write guard: a failing write is
counted and retried, never raised into the engine loop. `avkit simulate --cost FILE` and `avkit tune
--cost FILE` read it like any profiled table.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("avkit.serve")

COST_SNAPSHOT = "learned_cost.json"  # beside the coefficients snapshot


class CostSnapshots:
    def __init__(self, policy, path: Path, every: int = 512, side_writes=None):
        self.learner = getattr(policy, "learner", None)  # only the adaptive policy learns its cost
        self.path, self.every, self._side_writes = path, every, side_writes

    def on_step(self) -> None:
        """Engine thread, after each step: a snapshot every `every` learned steps."""
        if self.learner is not None and self.learner.steps % self.every == 0 and self.learner.steps:
            self.write_guarded()

    def write_guarded(self, *, force: bool = False) -> bool:
        if self.learner is None:
            return True
        if self._side_writes is None:
            self.write()
            return True
        return self._side_writes.run("cost", self.write, force=force)

    def write(self) -> None:
        self.learner.snapshot(self.path)
        log.info("learned cost model -> %s (%d steps)", self.path, self.learner.steps)


__all__ = ["COST_SNAPSHOT", "CostSnapshots"]
