"""Trace-replay simulator (avkit/sim): replay invariants, analytic acceptance, oracle, step time."""

import json

import numpy as np
import polars as pl
import pytest

from avkit.config import SimulateConfig, SyntheticConfig
from avkit.errors import ConfigError, TraceError
from avkit.scheduling.cost import CostTable
from avkit.scheduling.cost import resolve_cost
from avkit.sim.replay import default_policies, simulate, step_time_check, write_results
from avkit.sim.steps import schedule, step_table
from avkit.trace.synthetic import synthetic_trace

CFG = SyntheticConfig(num_slots=7 * 8 * 64 * 6, k=7, trim_prob=0.0, batch_size=8, steps_per_request=64, seed=3)


@pytest.fixture(scope="module")
def frame():
    return pl.from_arrow(synthetic_trace(CFG))


@pytest.fixture(scope="module")
def steps(frame):
    return step_table(frame)


def test_full_verification_replays_recorded_accepted_lengths(frame, steps):
    res = simulate(steps, resolve_cost("roofline:H200:8b"), [1], ["fixed:7"],
                   config=SimulateConfig(waves=1))
    per_step = frame.group_by("request_id", "step").agg(pl.col("num_accepted").first())
    assert res["mean_accepted"][0] == pytest.approx(per_step["num_accepted"].mean(), abs=1e-12)
    assert res["tokens_per_step"][0] == pytest.approx(per_step["num_accepted"].mean() + 1, abs=1e-12)


def test_fixed_k_acceptance_matches_analytic_within_4_sigma(steps):
    """E[min(K', L)] from the synthetic truth sigma(slope * f + b_j), with the replay's sampling error."""
    f = steps.features["logit_qmax"]  # [S, K]
    p = 1 / (1 + np.exp(-(CFG.slope * f + np.asarray(CFG.intercepts))))
    surv = np.cumprod(p, axis=1)  # P(first j+1 accepted)
    res = simulate(steps, resolve_cost("roofline:H200:8b"), [1], ["fixed"], config=SimulateConfig(waves=1))
    for kk, got in zip(range(1, 8), res["mean_accepted"]):
        analytic = surv[:, :kk].sum(axis=1).mean()
        sigma = np.minimum(steps.accepted, kk).std() / np.sqrt(steps.accepted.size)  # replay's sampling error
        assert abs(got - analytic) < 4 * sigma, (kk, got, analytic, sigma)
    assert np.all(np.diff(res["mean_accepted"].to_numpy()) >= 0)  # payoff non-decreasing in the budget


def test_oracle_never_loses_to_best_fixed(steps):
    cost = resolve_cost("roofline:H200:8b:1b:drafter=parallel")
    res = simulate(steps, cost, [1, 8, 64, 256], ["nospec", "fixed", "adaptive:oracle"])
    oracle = res.filter(pl.col("policy") == "adaptive-oracle")
    assert (oracle["vs_best_fixed"] >= 0.995).all(), oracle
    assert (oracle["vs_nospec"] > 1.0).all()
    assert not oracle["lossless"].any() and res.filter(pl.col("policy") == "fixed3")["lossless"].all()


def test_adaptive_never_verifies_more_than_drafted(steps):
    res = simulate(steps, resolve_cost("roofline:H200:8b"), [4, 64], ["fixed:7", "adaptive:qmax"])
    full, adaptive = res.filter(pl.col("policy") == "fixed7"), res.filter(pl.col("policy") == "adaptive-qmax")
    assert (adaptive["verified_per_step"] <= full["verified_per_step"]).all()
    assert adaptive["verified_per_step"][1] < full["verified_per_step"][1]  # trims at high load


def test_online_estimator_runs_and_is_deterministic(steps):
    cost = resolve_cost("roofline:H200:8b:1b:drafter=parallel")
    a = simulate(steps, cost, [32], ["adaptive:online_logistic"])
    b = simulate(steps, cost, [32], ["adaptive:online_logistic"])
    assert a.equals(b)
    assert 0 < a["verified_per_step"][0] <= 32 * 7


def test_schedule_keeps_every_lane_busy(steps):
    sched = schedule(steps, 16, waves=3)
    counts = np.bincount(sched.group)
    assert (counts == 16).all() and sched.num_groups == counts.size
    # a request's step rows run in recorded order, one per sim step: row index and sim step both +1
    req = steps.request[sched.rows]
    order = np.lexsort((sched.group, req))
    r, g, rows = req[order], sched.group[order], sched.rows[order]
    same = r[1:] == r[:-1]
    contiguous = (np.diff(rows) == 1) & (np.diff(g) == 1)
    assert np.mean(contiguous[same]) > 0.95  # the rest: a cycled copy of the same request restarting


def test_step_time_check(frame):
    cost = CostTable((1, 100), (5.0, 104.0), (1, 100), (0.5, 50.0))
    per_step = frame.group_by("engine_step").agg(
        pl.col("batch_size").first(), pl.col("num_verified").filter(pl.col("position") == 0).sum(),
        pl.col("num_drafted").max())
    truth = cost.step_cost(per_step["batch_size"].to_numpy(), per_step["num_drafted"].to_numpy(),
                           per_step["batch_size"].to_numpy() + per_step["num_verified"].to_numpy())
    recorded = per_step.select("engine_step", pl.Series("step_time_ms", truth * 1.25, dtype=pl.Float32))
    df = frame.drop("step_time_ms").join(recorded, on="engine_step")
    check = step_time_check(df, cost)
    assert check["median_ratio"] == pytest.approx(0.8, rel=1e-4)
    assert check["median_abs_rel_error"] == pytest.approx(0.2, rel=1e-4)

    # Steps that admitted a request (its step 0) also ran its prefill: 4x slower here; decode-only ignores them.
    admitting = frame.filter(pl.col("step") == 0)["engine_step"].unique()
    slow = pl.when(pl.col("engine_step").is_in(admitting.implode())).then(4.0).otherwise(1.0)
    df2 = df.with_columns((pl.col("step_time_ms") * slow).cast(pl.Float32))
    check = step_time_check(df2, cost)
    assert 0 < admitting.len() < check["engine_steps"]
    assert check["decode_only"]["engine_steps"] == check["engine_steps"] - admitting.len()
    assert check["decode_only"]["median_ratio"] == pytest.approx(0.8, rel=1e-4)
    assert check["mean_recorded_ms"] > check["decode_only"]["mean_recorded_ms"]

    # Two trace files count engine steps from 0 each: their steps stay apart.
    both = pl.concat([df.with_columns(pl.lit(i, dtype=pl.UInt16).alias("file_index")) for i in (0, 1)])
    assert step_time_check(both, cost)["engine_steps"] == 2 * per_step.height


def test_results_parquet_and_errors(steps, frame, tmp_path):
    res = simulate(steps, resolve_cost("roofline:H200:8b"), [2], ["nospec", "fixed:2"])
    path = write_results(res, tmp_path / "out" / "sim.parquet")
    assert pl.read_parquet(path).equals(res) and len(list(path.parent.iterdir())) == 1
    with pytest.raises(ConfigError, match="unknown policy"):
        simulate(steps, resolve_cost("roofline:H200:8b"), [2], ["greedy"])
    with pytest.raises(ConfigError, match="unknown estimator"):
        simulate(steps, resolve_cost("roofline:H200:8b"), [2], ["adaptive:nope"])
    with pytest.raises(TraceError, match="num_accepted"):
        step_table(frame.drop("num_accepted"))
    assert json.dumps(res.row(0, named=True))  # plain values for report


def test_adaptive_stop_drafting(steps):
    """Autoregressive drafter: stopping early keeps adaptive near the best fixed K at every load; with a
    parallel drafter (drafting cost independent of depth) it is the plain adaptive policy."""
    ar = resolve_cost("roofline:H200:8b")
    res = simulate(steps, ar, [1, 64, 256], ["fixed", "adaptive:online_logistic", "adaptive-stop:online_logistic"])
    stop = res.filter(pl.col("policy") == "adaptive-stop-online_logistic")
    plain = res.filter(pl.col("policy") == "adaptive-online_logistic")
    assert (stop["vs_best_fixed"] >= 0.95).all(), stop
    assert (stop["throughput_tok_s"] >= plain["throughput_tok_s"]).all()
    assert (stop["drafted_per_step"] < plain["drafted_per_step"]).all()
    par = resolve_cost("roofline:H200:8b:1b:drafter=parallel")
    a = simulate(steps, par, [64], ["adaptive:oracle", "adaptive-stop:oracle"])
    assert a["throughput_tok_s"][0] == a["throughput_tok_s"][1]


def test_simulate_cli(tmp_path, steps, capsys):
    from typer.testing import CliRunner

    from avkit.cli import app
    from avkit.trace.synthetic import write_synthetic_trace

    trace = write_synthetic_trace(tmp_path / "t.parquet", SyntheticConfig(num_slots=7 * 8 * 64, trim_prob=0.0))
    out = tmp_path / "r.parquet"
    r = CliRunner().invoke(app, ["simulate", str(trace), "--concurrency", "1,8", "--policy", "nospec,fixed:3",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert pl.read_parquet(out).shape[0] == 4
    before = out.read_bytes()
    with pytest.raises(SystemExit) as exit_:  # as the console script runs it: AvkitError -> one line, exit 2
        app(["simulate", str(trace), "--policy", "warp", "--out", str(out)], prog_name="avkit")
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("avkit: error: --policy warp: unknown policy; choose from "), err
    assert out.read_bytes() == before  # the earlier result is left as it was


def test_recorded_confidences_are_a_source(frame):
    truth = 1 / (1 + np.exp(-(CFG.slope * pl.col("logit_qmax") + 0.5)))
    steps_c = step_table(frame.with_columns(truth.cast(pl.Float32).alias("confidence")))
    cost = resolve_cost("roofline:H200:8b")
    assert "adaptive:recorded" in default_policies(steps_c, SimulateConfig())
    res = simulate(steps_c, cost, [64], ["fixed:7", "adaptive:recorded"])
    assert res["verified_per_step"][1] < res["verified_per_step"][0]
    with pytest.raises(ConfigError, match="confidence"):
        simulate(step_table(frame), cost, [4], ["adaptive:recorded"])


def test_stale_tokens_and_catch_up_follow_each_request():
    """Brute force over each request copy's rows in time order: tokens decoded since its last drafted step."""
    from avkit.sim.drive import stale_tokens

    rng = np.random.default_rng(0)
    copy = rng.integers(0, 5, 200)
    copy = copy[np.argsort(rng.permutation(200), kind="stable")]  # interleaved, as lanes share steps
    drafts = rng.random(200) < 0.3
    want = np.zeros(200, dtype=np.int64)
    for c in range(5):
        idle = 0
        for i in np.flatnonzero(copy == c):
            if drafts[i]:
                want[i], idle = idle, 0
            else:
                idle += 1
    np.testing.assert_array_equal(stale_tokens(copy, drafts), want)


def test_gated_simulation_pays_the_catch_up(steps):
    """With the gate switching, the gated policy's drafting time holds the catch-up passes; without
    switches (a cheap drafter: always on) there is nothing to catch up."""
    from avkit.config import AdaptiveConfig
    from avkit.scheduling.spec import parse_spec
    from avkit.sim.drive import SimPolicy, catch_up_ms, decide
    from avkit.sim.steps import Replay

    cost = CostTable((1, 8, 9, 16, 17, 64, 65, 512), (1.0, 1.0, 1.6, 1.6, 2.2, 2.2, 4.0, 20.0), (1, 16), (0.2, 0.55))
    replay = Replay.build(steps, schedule(steps, 16, waves=1), cost)
    gated = SimPolicy(parse_spec("adaptive:oracle"), adaptive=AdaptiveConfig(gate_window=16, probe_every=4))
    _, drafted, draft_ms = decide(gated.make(steps, cost), replay)
    extra = catch_up_ms(replay, drafted > 0)
    on = np.maximum.reduceat(drafted, replay.bounds[:-1]) > 0
    assert (extra > 0).sum() > 0 and not extra[~on].any()  # paid at drafting steps after a pause only
    passes = np.maximum.reduceat(drafted, replay.bounds[:-1])
    np.testing.assert_allclose(draft_ms, cost.draft_cost(replay.num_requests, passes) * on + extra)
    cheap = CostTable(cost.verify_tokens, cost.verify_ms, (1, 16), (0.01, 0.02))
    replay = Replay.build(steps, schedule(steps, 16, waves=1), cheap)
    assert not catch_up_ms(replay, decide(gated.make(steps, cheap), replay)[1] > 0).any()
