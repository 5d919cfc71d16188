"""`avkit tune` library (avkit/tune/): the schedule against brute force, ranges, feasibility, bootstrap, idle
prices, the engine fragments' rules."""

from fractions import Fraction
from itertools import pairwise

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from avkit.config import SimulateConfig, SyntheticConfig, TuneConfig
from avkit.errors import ConfigError
from avkit.metrics.uncertainty import resample_weights
from avkit.scheduling.cost import CostTable, resolve_cost
from avkit.scheduling.roofline import MODELS
from avkit.sim.replay import load_steps, simulate
from avkit.sim.steps import schedule
from avkit.trace.synthetic import write_synthetic_trace
from avkit.tune import tune
from avkit.tune.arms import Arm, interval, resampled_rate, simulate_arms, truncate
from avkit.tune.feasibility import memory_budget
from avkit.tune.formats import check_vllm
from avkit.tune.prefill import idle_costs
from avkit.tune.schedule import ranges

ROOFLINE = "roofline:H200:8b"  # these tests were set on the H200 roofline (the default is the shipped CPU table)

SMALL = SyntheticConfig(num_slots=7 * 8 * 24 * 5, k=7, trim_prob=0.0, batch_size=8, steps_per_request=24, seed=5)
CONC = (1, 4, 16)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return write_synthetic_trace(tmp_path_factory.mktemp("tune") / "t.parquet", SMALL)


@pytest.fixture(scope="module")
def result(trace):
    return tune([trace], TuneConfig(cost=ROOFLINE, concurrency=CONC, context=2048, bootstrap=200, max_k=5))


def test_schedule_is_the_argmax_of_an_independently_simulated_table(trace, result):
    """`avkit simulate`'s own table, argmax per concurrency by a plain loop, equals the tuner's choice."""
    table = simulate([trace], resolve_cost("roofline:H200:8b"), CONC,
                     ["nospec"] + [f"fixed:{k}" for k in range(1, 6)], config=SimulateConfig())
    for c in CONC:
        best_k, best = 0, -1.0
        for row in table.filter(pl.col("concurrency") == c).iter_rows(named=True):
            k = 0 if row["policy"] == "nospec" else int(row["policy"].removeprefix("fixed"))
            if row["throughput_tok_s"] > best:
                best_k, best = k, row["throughput_tok_s"]
        got = next(r for r in result["schedule"]["per_concurrency"] if r["concurrency"] == c)
        assert got["k"] == best_k, (c, got, best_k)
        cell = next(r for r in result["cells"] if r["concurrency"] == c and r["arm"] == got["fixed_arm"])
        assert cell["throughput_tok_s"] == pytest.approx(best, rel=1e-12)


def test_slo_picks_the_fastest_arm_that_meets_it(trace):
    loose = tune([trace], TuneConfig(cost=ROOFLINE, concurrency=CONC, context=2048, bootstrap=50, max_k=5))
    # an SLO between the fastest arm's p90 TPOT and the slowest's at c=16 forces a different choice there
    at16 = [r for r in loose["cells"] if r["concurrency"] == 16 and r["kind"] in ("nospec", "fixed")]
    best = max(at16, key=lambda r: r["throughput_tok_s"])
    slo = best["p90_tpot_ms"] * 0.999
    strict = tune([trace], TuneConfig(cost=ROOFLINE, concurrency=CONC, context=2048, bootstrap=50, max_k=5, tpot_slo_ms=slo))
    for c in CONC:
        cand = [r for r in strict["cells"] if r["concurrency"] == c and r["kind"] in ("nospec", "fixed")]
        ok = [r for r in cand if r["p90_tpot_ms"] <= slo]
        got = next(r for r in strict["schedule"]["per_concurrency"] if r["concurrency"] == c)
        if ok:
            assert got["fixed_arm"] == max(ok, key=lambda r: r["throughput_tok_s"])["arm"] and got["meets_slo"]
        else:
            assert got["fixed_arm"] == min(cand, key=lambda r: r["p90_tpot_ms"])["arm"] and not got["meets_slo"]
            assert c in strict["slo"]["unmet"]
    assert next(r for r in strict["schedule"]["per_concurrency"] if r["concurrency"] == 16)["fixed_arm"] != best["arm"]


def test_cell_accounting_matches_a_loop_over_sim_steps(trace):
    """Throughput and p90 TPOT of a fixed-K arm recomputed step by step from the cost table."""
    steps, cost, k = load_steps([trace]), resolve_cost("roofline:H200:8b"), 3
    (cell,) = simulate_arms(steps, [Arm("fixed", k)], cost, [4], waves=4, estimator="online_logistic", gate=True)
    sched = schedule(steps, 4, 4)
    step_ms, tokens = {}, {}
    per_copy_ms, per_copy_tok = {}, {}
    for row, g, copy in zip(sched.rows, sched.group, sched.copy):
        d = min(steps.drafted[row], k)
        step_ms.setdefault(g, []).append(d)
        t = min(d, steps.accepted[row]) + 1
        tokens[g] = tokens.get(g, 0) + t
        per_copy_tok[copy] = per_copy_tok.get(copy, 0) + t
    total_ms = 0.0
    for g, drafts in step_ms.items():
        n = len(drafts)
        ms = float(cost.draft_cost(n, max(drafts)) + cost.context_cost(n) + cost.verify_cost(n + sum(drafts)))
        step_ms[g] = ms
        total_ms += ms
    for g, copy in zip(sched.group, sched.copy):
        per_copy_ms[copy] = per_copy_ms.get(copy, 0.0) + step_ms[g]
    assert cell.throughput == pytest.approx(1e3 * sum(tokens.values()) / total_ms, rel=1e-9)
    assert 1e3 * cell.tokens.sum() / cell.time_ms.sum() == pytest.approx(cell.throughput, rel=1e-9)
    lengths = steps.steps_per_request
    rows = np.bincount(sched.copy)
    whole = [c for c in per_copy_ms if rows[c] == lengths[c % steps.num_requests]]
    tpot = np.percentile([per_copy_ms[c] / per_copy_tok[c] for c in whole], 90)
    assert cell.p90_tpot_ms == pytest.approx(tpot, rel=1e-9)


def test_truncated_traces_replay_like_fixed_k(trace):
    steps = load_steps([trace])
    cut = truncate(steps, 3)
    assert cut.k == 3 and cut.label.shape[1] == 3 and (cut.accepted <= 3).all()
    cost = resolve_cost("roofline:H200:8b")
    a = simulate(steps, cost, [4], ["fixed:3"])["throughput_tok_s"][0]
    b = simulate(cut, cost, [4], ["fixed:3"])["throughput_tok_s"][0]
    assert a == pytest.approx(b, rel=1e-12)


def test_ranges_are_log_nearest_contiguous_and_merged():
    rng = np.random.default_rng(0)
    for _ in range(200):
        conc = sorted(set(rng.integers(1, 300, size=rng.integers(1, 8)).tolist()))
        values = rng.integers(0, 3, size=len(conc)).tolist()
        got = ranges(conc, values)
        assert got[0][0] == 1 and got[-1][1] == conc[-1]
        assert all(a[1] + 1 == b[0] for a, b in pairwise(got))  # contiguous
        assert all(a[2] != b[2] for a, b in pairwise(got))  # merged
        for b in range(1, conc[-1] + 1):  # brute force: nearest concurrency on a log scale, ties to the lower
            d = [max(Fraction(b, c), Fraction(c, b)) for c in conc]  # exact: e^|log b - log c|
            want = values[d.index(min(d))]
            assert next(v for lo, hi, v in got if lo <= b <= hi) == want, (conc, values, b)
    assert ranges([1, 2, 4, 8], [5, 5, 5, 5]) == [(1, 8, 5)]
    assert ranges([1, 64], [5, 3], last_hi=93) == [(1, 8, 5), (9, 93, 3)]


def test_infeasible_cells_are_flagged_not_simulated(trace):
    """8B target on one H200 at 8192 tokens: 256 requests do not fit (the issue's example)."""
    res = tune([trace], TuneConfig(cost=ROOFLINE, concurrency=(1, 64, 256), context=8192, bootstrap=20, max_k=2))
    t8, d05 = MODELS["8b"], MODELS["0.5b"]
    kv = t8.kv_bytes_per_token(2.0) + d05.kv_bytes_per_token(2.0)
    pool = int((0.9 * 141e9 - (t8.params + d05.params) * 2.0) // kv)
    assert res["memory"]["kv_tokens"] == pool and res["memory"]["max_concurrency"] == pool // 8192
    assert [r["concurrency"] for r in res["infeasible"]] == [256] and res["concurrency"] == [1, 64]
    assert not any(r["concurrency"] == 256 for r in res["cells"])
    assert res["schedule"]["ranges"][-1][1] == pool // 8192  # the schedule ends where memory does
    assert any("max_num_seqs" in n for n in res["notes"])
    with pytest.raises(ConfigError, match="no --concurrency fits"):
        tune([trace], TuneConfig(cost=ROOFLINE, concurrency=(256,), context=8192, bootstrap=20, max_k=2))


def test_memory_from_a_profiled_table_and_an_override():
    table = CostTable((1, 8), (10.0, 12.0), (1, 8), (2.0, 3.0),
                      meta={"source": "profile", "device": "cpu", "target": "qwen2.5-coder-1.5b",
                            "draft": "qwen2.5-coder-0.5b", "dtype": "bfloat16"})
    assert memory_budget(table) is None  # device memory unknown
    budget = memory_budget(table, memory_gb=24.0)
    t, d = MODELS["1.5b"], MODELS["0.5b"]
    assert budget["weights_gb"] == pytest.approx((t.params + d.params) * 2 / 1e9)
    assert budget["kv_bytes_per_token"] == t.kv_bytes_per_token(2) + d.kv_bytes_per_token(2)


def test_context_comes_from_the_generations_tables(tmp_path, trace):
    gen = trace.with_name(trace.name.removesuffix(".parquet") + ".generations.parquet")
    ids = pl.read_parquet(trace, columns=["run_id", "request_id"]).unique().sort("request_id")
    n = ids.height
    pq.write_table(pa.table({"run_id": ids["run_id"].cast(pl.Utf8).to_list(),
                             "request_id": ids["request_id"].cast(pl.Utf8).to_list(),
                             "prompt_ids": [[1] * (100 if i % 2 else 300) for i in range(n)],
                             "output_ids": [[2] * 5] * n}), gen)
    try:  # prompts from the generations table, generated tokens as replayed (accepted + 1 per step)
        generated = float((load_steps([str(trace)]).accepted + 1).sum()) / n
        res = tune([trace], TuneConfig(cost=ROOFLINE, concurrency=(1,), bootstrap=20, max_k=1))
        want = round((100 * (n // 2) + 300 * (n - n // 2)) / n + generated)
        assert res["context"]["tokens"] == want and res["memory"]["context"] == want
    finally:
        gen.unlink()
    with pytest.raises(ConfigError, match="pass --context"):
        tune([trace], TuneConfig(cost=ROOFLINE, concurrency=(1,), bootstrap=20, max_k=1))


def test_bootstrap_is_seeded_paired_and_matches_a_loop():
    rng = np.random.default_rng(1)
    tok, ms = rng.integers(50, 200, 30).astype(float), rng.uniform(100, 900, 30)
    w = resample_weights(30, 500, seed=7)
    assert np.array_equal(w, resample_weights(30, 500, seed=7)) and (w.sum(axis=1) == 30).all()
    rate = resampled_rate(w, tok, ms)
    for b in range(3):  # brute force: expand the resample into a list of requests
        picked = np.repeat(np.arange(30), w[b].astype(int))
        assert rate[b] == pytest.approx(1e3 * tok[picked].sum() / ms[picked].sum(), rel=1e-12)
    lo, hi = interval(rate, 0.9)
    assert lo < 1e3 * tok.sum() / ms.sum() < hi
    same = resampled_rate(w, tok, ms) / rate  # a cell against itself: paired ratio exactly 1
    assert interval(same, 0.9) == (1.0, 1.0)


def test_idle_prices_follow_the_cost_table():
    table = CostTable((1, 64), (10.0, 20.0), (1, 1024), (2.0, 50.0))
    got = idle_costs(table, concurrency=8, nospec_step_ms=11.0, prompt_tokens=300, output_tokens=100)
    draft = lambda n: float(np.interp(n, [1, 1024], [2.0, 50.0]))
    assert got["sync_share"] == pytest.approx(draft(8) / 11.0)
    # no profiled prefill: a prefill of n tokens is priced as a draft pass over n rows (an upper bound)
    assert got["catch_up_share"]["64"] == pytest.approx(8 * draft(64) / (64 * 11.0))
    assert got["prefill_share"] == pytest.approx(8 * draft(300) / (100 * 11.0))
    assert got["overhead_share"] == pytest.approx(got["prefill_share"] + min(got["sync_share"],
                                                                              got["catch_up_share"]["64"]))
    profiled = CostTable((1, 64), (10.0, 20.0), (1, 1024), (2.0, 50.0), prefill_tokens=(16, 512),
                         prefill_ms=(4.0, 128.0))
    got = idle_costs(profiled, concurrency=8, nospec_step_ms=11.0, prompt_tokens=300, output_tokens=100)
    prefill = lambda n: float(np.interp(n, [16, 512], [4.0, 128.0]))
    assert got["sync_share"] == pytest.approx(draft(8) / 11.0)  # the decode pass is still the table's draft pass
    assert got["catch_up_share"]["64"] == pytest.approx(8 * prefill(64) / (64 * 11.0))
    assert got["prefill_share"] == pytest.approx(8 * prefill(300) / (100 * 11.0))


def test_result_is_deterministic_and_self_consistent(trace, result):
    again = tune([trace], TuneConfig(cost=ROOFLINE, concurrency=CONC, context=2048, bootstrap=200, max_k=5))
    when = {"inputs": {**result["inputs"], "written": ""}}  # the provenance record's time may differ
    assert {**again, **{"inputs": {**again["inputs"], "written": ""}}} == {**result, **when}
    s = result["schedule"]
    assert check_vllm(result["vllm"]) if result["vllm"] else True
    assert {r["arm"] for r in result["cells"]} >= {"nospec", "fixed5", "adaptive-K5", "adaptive-stop-K5"}
    for r in result["cells"]:
        assert r["lo"] * (1 - 1e-9) <= r["throughput_tok_s"] <= r["hi"] * (1 + 1e-9)
    for r in s["per_concurrency"]:  # gains are the ratios of the table's cells
        cell = {x["arm"]: x["throughput_tok_s"] for x in result["cells"] if x["concurrency"] == r["concurrency"]}
        assert r["vs_nospec"]["ratio"] == pytest.approx(cell[r["arm"]] / cell["nospec"])
        assert r["vs_single_k"]["ratio"] == pytest.approx(cell[r["arm"]] / cell[f"fixed{s['single_k']}"])
        assert r["arm"] == (f"adaptive-K{r['k']}" if s["adaptive"] and r["k"] else r["fixed_arm"])


def test_catch_up_rule_is_priced_from_the_table_and_the_cost(trace, result):
    """schedule.catch_up: batch ms saved per token = 1000/no-spec - 1000/chosen arm, from the cells; the
    prefill price is the cost table's (roofline: none profiled, a draft pass over n rows)."""
    rule = result["schedule"]["catch_up"]
    cells = {(x["arm"], x["concurrency"]): x["throughput_tok_s"] for x in result["cells"]}
    assert rule["concurrency"] == list(CONC)
    for c, saving, r in zip(CONC, rule["saving_ms"], result["schedule"]["per_concurrency"]):
        assert saving == pytest.approx(1000 / cells["nospec", c] - 1000 / cells[r["arm"], c], rel=1e-12)
        assert (saving == 0.0) == (r["k"] == 0)
        assert rule["accepted"][CONC.index(c)] == next(x for x in result["cells"] if x["concurrency"] == c and x["arm"]
                                                        == r["arm"])["tokens_per_step"] - 1.0
    cost = resolve_cost("roofline:H200:8b")
    back = CostTable.from_json(rule["cost"])  # the rule carries the cost model itself, not copies of its curves
    assert back.to_json() == {**cost.to_json(), "meta": back.meta}
    assert any("no profiled drafter prefill" in n for n in result["notes"])


def test_datasets_option_tunes_on_those_requests_only(trace):
    frame = pl.read_parquet(trace)
    names = sorted(frame["dataset"].cast(pl.Utf8).unique().to_list())
    one = tune([trace], TuneConfig(cost=ROOFLINE, concurrency=(1, 4), context=2048, bootstrap=20, max_k=3, datasets=(names[0],)))
    want = frame.filter(pl.col("dataset").cast(pl.Utf8) == names[0])["request_id"].n_unique()
    assert one["requests"] == want < frame["request_id"].n_unique() and one["config"]["datasets"] == [names[0]]
    with pytest.raises(ConfigError, match=f"--datasets nope: no such dataset in the traces \\(they have "
                                          f"{', '.join(names)}\\)"):
        tune([trace], TuneConfig(cost=ROOFLINE, concurrency=(1,), context=2048, datasets=("nope",)))
    with pytest.raises(ConfigError, match="--datasets must be distinct non-empty names"):
        TuneConfig(datasets=("a", "a"))


def test_profiled_memory_meta_matches_the_kv_cache_it_allocates(tmp_path):
    """`avkit profile` records what feasibility needs; the KV bytes per token match a real cache's tensors."""
    from avkit.models import load
    from avkit.models.testing import write_tiny_model
    from avkit.scheduling.profile import memory_meta

    target = load(write_tiny_model(tmp_path / "t", vocab=300, seed=0)).model
    draft = load(write_tiny_model(tmp_path / "d", vocab=300, seed=1, hidden=32)).model
    meta = memory_meta(target, draft)
    per_token = 0
    for m in (target, draft):
        cache = m.new_cache(2, 10)  # 2 requests x 10 positions
        per_token += (cache.k.numel() * cache.k.element_size() + cache.v.numel() * cache.v.element_size()) / 20
    assert meta["kv_bytes_per_token"] == pytest.approx(per_token)
    weights = sum(p.numel() * p.element_size() for m in (target, draft) for p in m.parameters())
    assert meta["weights_gb"] == pytest.approx(weights / 1e9) and meta["memory_gb"] > 1.0
