"""The clairvoyant router (avkit/hvd/verdict.py): its dynamic program equals a brute-force recursion over
every decode path, and no routed decode path of the replay beats it under the same cost model."""

from __future__ import annotations

from functools import cache

import numpy as np
import polars as pl
import pytest

from avkit.config import HvdReplayConfig, SuffixCacheConfig
from avkit.hvd.cost import cost_from_json
from avkit.hvd.verdict import oracle_paths
from avkit.hvd.path import Route, simulate_paths
from avkit.hvd.replay import replay, synthetic_generations

K = 5
COSTS = {"linear": cost_from_json(dict(draft_step_cost=0.33)),
         "staircase": cost_from_json(dict(verify_points=((1, 1.0), (3, 1.1), (4, 1.6), (6, 1.7), (8, 2.9)),
                                    draft_points=((1, 0.5), (16, 1.4)), cache_cost=0.01))}


@pytest.fixture(scope="module")
def table():
    gens = synthetic_generations(num_requests=5, seed=7, vocab=50, prompt_len=30, output_len=45)
    return replay(gens, SuffixCacheConfig(max_depth=8, use_global=True), HvdReplayConfig(k=K))


def _cheapest(ca: np.ndarray, ma: np.ndarray, cost) -> float:
    """One request's cheapest decode, by plain recursion over positions trying every option."""
    n = len(ca)

    @cache
    def best(t: int) -> float:
        if t >= n:
            return 0.0
        options = [float(cost.verify_cost(1)) + best(t + 1)]  # a plain target step
        for b in range(1, K + 1):
            tail = float(cost.verify_cost(1 + b)) + best(t + b + 1)
            if b <= ca[t]:
                options.append(tail + cost.lookup_ms)
            if b <= min(ma[t], K):
                options.append(tail + b * float(cost.draft_pass_cost(1)))
        return min(options)

    return best(0)


def _brute(table: pl.DataFrame, cost) -> float:
    """Sum over requests of the cheapest decode."""
    return sum(_cheapest(np.minimum(part["cache_acc"].to_numpy(), part["draft_len"].to_numpy()),
                         part["model_acc"].to_numpy(), cost)
               for _, part in table.group_by("request_id", maintain_order=True))


@pytest.mark.parametrize("name", sorted(COSTS))
def test_dynamic_program_equals_brute_force(table, name):
    cost = COSTS[name]
    got = oracle_paths(table, cost, K)
    assert got["tokens"] == table.height
    assert got["cost"] == pytest.approx(_brute(table, cost), rel=1e-12)
    assert 1 <= got["cycles"] <= table.height


@pytest.mark.parametrize("name", sorted(COSTS))
def test_no_routed_path_beats_the_oracle(table, name):
    cost, rng = COSTS[name], np.random.default_rng(11)
    bound = oracle_paths(table, cost, K)["throughput"]
    dl = table["draft_len"].to_numpy()
    routes = [Route(np.zeros(table.height, bool), dl), Route(dl > 0, dl)]  # model-only, cache-first
    routes += [Route(rng.random(table.height) < p, rng.integers(0, K + 1, table.height)) for p in (0.3, 0.7)]
    for route in routes:
        paths = simulate_paths(table, route, cost, K)
        assert paths["tokens"].sum() / paths["cost"].sum() <= bound + 1e-12


def test_nothing_accepted_is_target_only(table):
    none = table.with_columns(pl.lit(0).alias("cache_acc"), pl.lit(0).alias("model_acc"))
    got = oracle_paths(none, COSTS["staircase"], K)
    assert got["throughput"] == pytest.approx(1.0) and got["cycles"] == table.height
