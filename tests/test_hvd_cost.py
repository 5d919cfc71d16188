"""The HVD cost model from a measured step-cost table (avkit/hvd/cost.py): the curves are the table's,
in target forwards of one token; they survive the payoff file; bad tables are one-line errors; a step is
priced by `CostTable.step_cost`, the cache lookup per request that consulted it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from avkit.cli import app
from avkit.config import HvdCostConfig
from avkit.errors import ConfigError
from avkit.hvd.cost import cost_from_json, in_forwards, linear_table, summary
from avkit.scheduling.cost import CostTable

TABLE = {"verify_tokens": [1, 2, 4, 8, 16, 32], "verify_ms": [93.8, 96.5, 109.7, 186.2, 344.0, 673.0],
         "draft_requests": [1, 2, 4, 8, 16], "draft_ms": [46.4, 52.7, 54.6, 77.3, 128.4],
         "drafter": "autoregressive", "meta": {"device": "cpu x86_64 x2 threads"},
         "prefill_tokens": [16, 64, 256, 512], "prefill_ms": [90.0, 305.0, 1216.0, 2598.0]}


def test_curves_are_the_tables_in_forwards_of_one_token(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(TABLE))
    cost, table = in_forwards(CostTable.load(path)), CostTable.load(path)
    unit = table.verify_cost(1)
    t = np.array([1, 3, 5, 7, 8, 13, 31, 40, 77])  # odd places, inside and past the grid
    assert np.allclose(cost.verify_cost(t), table.verify_cost(t) / unit, rtol=1e-12)
    n = np.array([1, 3, 9, 16, 21])
    assert np.allclose(cost.draft_pass_cost(n), table.draft_pass_cost(n) / unit, rtol=1e-12)
    c = summary(cost)
    assert c["draft_step_cost"] == pytest.approx(46.4 / 93.8)
    assert c["verify_token_cost"] == pytest.approx(np.polyfit(np.arange(1, 9), table.verify_cost(np.arange(1, 9)) / unit,
                                                              1)[0])
    assert str(path) in c["source"] and "cpu x86_64" in c["source"]
    fixed = in_forwards(CostTable.from_json({**TABLE, "draft_fixed_ms": [10.0, 11.0, 12.0, 13.0, 14.0]}))
    for k in (1, 3, 7):  # k passes and the fixed part once, as the engine's cost model prices drafting
        want = (k * table.draft_pass_cost(n) + np.interp(n, TABLE["draft_requests"], [10, 11, 12, 13, 14])) / unit
        assert np.allclose(fixed.draft_cost(n[n <= 16], k), want[n <= 16], rtol=1e-12)
    lag = np.array([2, 3, 17, 65, 300, 700])  # the catch-up prefills lag - 1 tokens (below 16: a draft step)
    fed = lag - 1
    want = np.where(lag > 2, np.where(fed < 16, table.draft_pass_cost(fed), table.draft_prefill_cost(fed)), 0) / unit
    assert np.allclose(cost.catch_up_cost(lag), want, rtol=1e-12)


def test_linear_default_and_roundtrip_through_the_payoff_extra():
    lin = linear_table(HvdCostConfig(verify_token_cost=0.1, draft_step_cost=0.4))
    assert np.allclose(lin.verify_cost([0, 1, 9]), [1.0, 1.1, 1.9]) and np.allclose(lin.draft_pass_cost([1, 16]), [0.4, 0.4])
    assert not lin.catch_up_cost([0, 3, 500]).any()  # the linear model prices no catch-up
    cost = in_forwards(CostTable(**{k: tuple(v) if isinstance(v, list) else v for k, v in TABLE.items()}))
    for c in (lin, cost):
        back = cost_from_json(json.loads(json.dumps(summary(c))))  # lists in, tuples out (payoff_survival.pt)
        assert back == c


def test_payoff_files_of_the_point_format_still_load():
    """Older payoff files stored the scalars and (x, cost) points: they price exactly as those points did."""
    old = {"verify_token_cost": 0.03, "draft_step_cost": 0.5, "cache_cost": 0.01, "source": "t.json (cpu)",
           "verify_points": [[1.0, 1.0], [4.0, 1.1], [8.0, 2.0]], "draft_points": [[1.0, 0.5], [16.0, 1.4]],
           "prefill_points": [[16.0, 1.0], [256.0, 15.0]]}
    cost = cost_from_json(old)
    np.testing.assert_allclose(cost.verify_cost([1, 6, 12]), [1.0, 1.55, 2.9])
    np.testing.assert_allclose(cost.draft_pass_cost([1, 6]), [0.5, 0.5 + 0.9 * 5 / 15])
    np.testing.assert_allclose(cost.catch_up_cost([2, 17, 257]), [0.0, 1.0, 15.0])
    assert cost.lookup_ms == 0.01 and summary(cost)["source"] == "t.json (cpu)"
    assert cost_from_json({"draft_step_cost": 0.2}) == linear_table(HvdCostConfig(draft_step_cost=0.2))
    # the table format of before: its per-step c_cache reads as the per-request lookup price
    table = {"table": linear_table().to_json(), "cache_cost": 0.02, "verify_token_cost": 0.02,
             "draft_step_cost": 0.33, "source": ""}
    assert cost_from_json(table) == linear_table(HvdCostConfig(cache_cost=0.02))


@pytest.mark.parametrize("pts", [((2, 1.0), (1, 2.0)), ((1, -1.0),), ((-1, 1.0), (2, 2.0))])
def test_bad_points_are_refused(pts):
    with pytest.raises(ConfigError, match="verify"):
        cost_from_json(dict(verify_points=pts))


def _run(capsys, *args):
    try:
        app([str(a) for a in args], prog_name="avkit")
        code = 0
    except SystemExit as e:
        code = e.code or 0
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("change, match", [
    (None, "no such file"),
    (lambda d: d.update(verify_ms=[93.8, 90.0, 109.7, 186.2, 344.0, 673.0]), "non-decreasing"),
    (lambda d: d.update(context_ms=[1.0, 2.0, 3.0, 4.0, 5.0]), "context_ms"),
])
def test_hvd_cli_bad_cost_table_is_one_line(change, match, tmp_path, capsys):
    path = tmp_path / "cost.json"
    if change is not None:
        d = json.loads(json.dumps(TABLE))
        change(d)
        path.write_text(json.dumps(d))
    code, lines = _run(capsys, "hvd", "--synthetic", "6", "--out", tmp_path / "out", "--cost-table", path)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("avkit: error: ") and match in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_a_learned_lookup_price_is_the_cache_cost():
    """A table whose cost model learned what a cache lookup costs live (lookup_ms) prices HVD's lookups with it, in
    target forwards of one token; a table without one keeps HvdCostConfig's."""
    learned = in_forwards(CostTable.from_json({**TABLE, "lookup_ms": 4.69}))
    assert learned.lookup_ms == pytest.approx(4.69 / 93.8)
    assert in_forwards(CostTable.from_json(TABLE)).lookup_ms == HvdCostConfig.cache_cost


def test_a_batched_step_pays_one_lookup_per_request_that_consulted_the_cache():
    """`simulate_batched` prices a step as `CostTable.step_cost` does live: c_cache per request that looked the
    cache up (here every request: the hybrid consults it on model cycles too), not once per step."""
    import polars as pl

    from avkit.hvd.joint import simulate_batched
    from avkit.hvd.path import full_route

    n, length = 4, 10  # 4 requests of 10 tokens, no cache draft anywhere: plain target steps of 4 rows
    table = pl.DataFrame({"request_id": np.repeat(np.arange(n), length), "dataset": ["d"] * (n * length),
                          "draft_len": np.zeros(n * length, dtype=np.int64), "cache_acc": np.zeros(n * length, dtype=np.int64),
                          "model_acc": np.zeros(n * length, dtype=np.int64)})
    route = full_route(table, np.zeros(n * length, dtype=bool), consults_cache=True)
    for c_cache in (0.0, 0.05):
        cost = linear_table(HvdCostConfig(verify_token_cost=0.1, draft_step_cost=0.0, cache_cost=c_cache))
        got = simulate_batched(table, route, cost, 1, n)
        # every step: 4 rows, each drafted 1 token by the model (free), none accepted -> 10 steps of 4 rows
        step = 1 + 0.1 * (n + n) + n * c_cache
        assert got["steps"] == length and n * length / got["throughput"] == pytest.approx(length * step)
