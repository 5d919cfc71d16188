"""The server learns its cost model from its own steps (avkit/serve/side_writes.py `Snapshots`): the learned model is
snapshotted as a cost file at shutdown, a failing snapshot is counted and never raised, and the engine's
policy reports each step's actual / predicted time."""

from __future__ import annotations

import numpy as np

from avkit.config import SamplingConfig
from avkit.runtime.request import Request
from avkit.scheduling.cost import CostTable
from avkit.serve.server import build_state
from serve_support import serve_config


def _steps(state, n: int = 2):
    engine = state.make_engine()
    engine.generate([Request(f"r{i}", [5 + i, 17, 33, 9, 4], SamplingConfig(temperature=0.0, max_new_tokens=20))
                     for i in range(n)])
    return engine


def test_serve_learns_and_snapshots_its_cost_model(pair, tmp_path):
    state = build_state(serve_config(pair, tmp_path), target=pair[2], draft=pair[3])
    engine = _steps(state)
    learner = engine.policy.learner
    assert learner is not None and learner.steps == engine.stats.steps > 0
    assert engine.stats.cost_ratio is not None and np.isfinite(engine.stats.cost_ratio)
    state.on_close()
    table = CostTable.load(tmp_path / "learned_cost.json")
    assert table.meta["source"] == "learned" and table.meta["steps"] == learner.steps
    assert table.verify_tokens == learner.prior.verify_tokens  # the prior's grid, learned ordinates


def test_a_failing_cost_snapshot_is_counted_not_raised(pair, tmp_path):
    (tmp_path / "learned_cost.json").mkdir()  # cannot be replaced by a file
    state = build_state(serve_config(pair, tmp_path), target=pair[2], draft=pair[3])
    _steps(state, 1)
    state.on_close()  # does not raise
    text = state.metrics.render().decode()
    assert 'avkit_side_write_failures_total{kind="cost"} 1.0' in text
