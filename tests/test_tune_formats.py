"""The acceptance profile (avkit/tune/acceptance.py) and its compilation into every engine's settings
(avkit/tune/formats.py): each number against an independent oracle, each format against its rules.

Oracles: a Python loop over request-steps for the per-position counts, statsmodels' Logit for the fitted
coefficients, the closed-form geometric sum for TensorRT-LLM's break-even rate. vLLM's own SpeculativeConfig
checks the vLLM payloads in tests/test_tune_vllm.py (`vllm` marker); SGLang and TensorRT-LLM do not install
here: their schema checks are tested below.
"""

from __future__ import annotations

import bisect
import re

import numpy as np
import polars as pl
import pytest

from avkit.config import SyntheticConfig, TuneConfig
from avkit.errors import ConfigError
from avkit.scheduling.cost import CostTable
from avkit.trace.reader import read_traces
from avkit.trace.synthetic import write_synthetic_trace
from avkit.tune import tune
from avkit.tune.formats import (TRTLLM_KEYS, break_even_rate, check_sglang, check_synthetic, check_trtllm,
                                check_vllm, check_vllm_context, trtllm_schedule, vllm_spec)

SMALL = SyntheticConfig(num_slots=7 * 8 * 24 * 4, k=7, trim_prob=0.0, batch_size=8, steps_per_request=24, seed=3)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return write_synthetic_trace(tmp_path_factory.mktemp("formats") / "t.parquet", SMALL)


@pytest.fixture(scope="module")
def result(trace):
    return tune([trace], TuneConfig(concurrency=(1, 4, 16), context=1024, bootstrap=20, max_k=5,
                                    draft="/models/draft"))


def _brute_counts(rows: pl.DataFrame, k: int) -> tuple[int, list[int], list[int]]:
    """Loop over request-steps: drafts, reached[j], accepted[j] (accepted length > j)."""
    drafts, reached, accepted = 0, [0] * k, [0] * k
    for _, g in rows.group_by("request_id", "step"):
        labels = dict(zip(g["position"].to_list(), g["accepted"].to_list()))
        if not g.filter(pl.col("verified") & (pl.col("position") == 0)).height:
            continue
        drafts += 1
        for j in range(k):
            if labels.get(j) is None:
                break
            reached[j] += 1
            if not labels[j]:
                break
            accepted[j] += 1
    return drafts, reached, accepted


def test_profile_counts_equal_a_loop_over_request_steps(trace, result):
    rows = read_traces([trace])
    drafts, reached, accepted = _brute_counts(rows, SMALL.k)
    pooled = result["profile"]["groups"][-1]
    assert pooled["dataset"] == "all" and pooled["drafts"] == drafts
    assert [p["reached"] for p in pooled["positions"]] == reached
    assert [p["accepted"] for p in pooled["positions"]] == accepted
    for p in pooled["positions"]:
        assert p["conditional_lo"] <= p["conditional"] <= p["conditional_hi"]
        assert p["survival"] == pytest.approx(p["accepted"] / drafts)
    per_group = [g for g in result["profile"]["groups"][:-1]]
    assert sum(g["drafts"] for g in per_group) == drafts  # the groups partition the request-steps
    assert {(g["dataset"], g["temperature"]) for g in per_group} == {
        (d, round(float(t), 6)) for d, t in rows.select(pl.col("dataset").cast(pl.Utf8), "temperature").unique().rows()}


def test_fitted_coefficients_equal_statsmodels_logit(trace, result):
    import statsmodels.api as sm  # lazy: heavy; in the test extra
    obs = read_traces([trace]).filter(pl.col("accepted").is_not_null())
    f = obs["logit_qmax"].to_numpy().astype(np.float64)
    pos = obs["position"].to_numpy()
    x = np.column_stack([f, np.eye(SMALL.k)[pos]])  # [N, 1 + K]: shared slope, one intercept per position
    fit = sm.Logit(obs["accepted"].cast(pl.Float64).to_numpy(), x).fit(disp=0, tol=1e-12, maxiter=100)
    coef = result["profile"]["coefficients"]
    assert coef["slope"] == pytest.approx(fit.params[0], abs=1e-6)
    assert coef["intercepts"] == pytest.approx(list(fit.params[1:]), abs=1e-6)
    from avkit.estimators.coefficients import check_coefficients

    check_coefficients(coef, "profile", k=SMALL.k)  # a valid coefficients.json (what the plugin warm-starts from)


def test_every_format_is_compiled_and_passes_its_rules(trace, result):
    ranges = [tuple(r) for r in result["schedule"]["ranges"]]
    top = max(k for _, _, k in ranges)
    assert top > 0, "the fixture must recommend speculation somewhere"
    vllm = result["vllm"]
    assert vllm == vllm_spec(ranges, False, {"method": "draft_model", "model": "/models/draft",
                                             "draft_sample_method": vllm["draft_sample_method"]})
    sampled = read_traces([trace])["temperature"].max() > 0
    assert vllm["draft_sample_method"] == ("probabilistic" if sampled else "greedy")
    ctx = check_vllm_context(result["vllm_context"])["num_speculative_tokens_per_batch_size"]
    assert ctx == [[lo, hi, 0, 1024, k] for lo, hi, k in ranges]
    synth = check_synthetic(result["vllm_synthetic"])
    pooled = result["profile"]["groups"][-1]["positions"]
    assert synth["synthetic_acceptance_rates"] == [round(p["survival"], 6) for p in pooled[:top]]
    assert check_sglang(result["sglang"]) == {str(lo): {"candidate_steps": [k]} for lo, _, k in ranges}
    route = sorted(int(b) for b in result["sglang"])  # SGLang's routing: the largest key <= the batch size
    for b in range(1, ranges[-1][1] + 1):
        key = max(x for x in route if x <= b)
        assert result["sglang"][str(key)]["candidate_steps"] == [next(k for lo, hi, k in ranges if lo <= b <= hi)]
    trt = check_trtllm(result["trtllm"])
    assert trt["draft_len_schedule"] == {str(hi): k for _, hi, k in trtllm_schedule(ranges)}


def test_break_even_rate_against_the_closed_form():
    cost = CostTable(verify_tokens=(1, 8, 64), verify_ms=(10.0, 14.0, 40.0), draft_requests=(1, 64),
                     draft_ms=(1.5, 6.0))
    for k in (1, 3, 7):
        rate = break_even_rate(cost, k)
        ratio = (cost.step_cost(1, k, k + 1) / cost.step_cost(1, 0, 1)).item()
        # accepted / drafted = (S - 1) / k with S = sum_i a^i; invert S(a) = ratio by bisection
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if sum(mid ** i for i in range(k + 1)) < ratio else (lo, mid)
        assert rate == pytest.approx((sum(lo ** i for i in range(k + 1)) - 1) / k, abs=1e-4)
    slow = CostTable(verify_tokens=(1, 8), verify_ms=(1.0, 100.0), draft_requests=(1, 64), draft_ms=(50.0, 60.0))
    assert break_even_rate(slow, 7) == 1.0  # drafting never pays at one request: the gate is always shut


def test_vllm_rules():
    frag = vllm_spec([(1, 2, 7), (3, 11, 5), (12, 16, 0)], adaptive=True)
    assert frag == {"num_speculative_tokens": 7, "num_speculative_tokens_per_batch_size": [[1, 2, 7], [3, 11, 5],
                                                                                          [12, 16, 0]],
                    "enable_adaptive_verification": True}
    assert vllm_spec([(1, 16, 0)], adaptive=False) is None
    bad = {"no K": ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
           "empty": ({"num_speculative_tokens_per_batch_size": []}, "non-empty"),
           "not 1": ({"num_speculative_tokens_per_batch_size": [[2, 4, 3]]}, "starts at 2"),
           "gap": ({"num_speculative_tokens_per_batch_size": [[1, 4, 3], [6, 8, 2]]}, "starts at 6"),
           "overlap": ({"num_speculative_tokens_per_batch_size": [[1, 4, 3], [4, 8, 2]]}, "starts at 4"),
           "lo > hi": ({"num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 4, 2]]}, "batch_lo 5 > batch_hi 4"),
           "K < 0": ({"num_speculative_tokens_per_batch_size": [[1, 4, -1]]}, "K must be an integer >= 0"),
           "K > n": ({"num_speculative_tokens_per_batch_size": [[1, 4, 9]]}, "K 9 > num_speculative_tokens 7"),
           "5 items": ({"num_speculative_tokens_per_batch_size": [[1, 4, 0, 9, 3]]}, "must be \\(batch_lo"),
           "flag": ({"enable_adaptive_verification": "yes"}, "must be a bool")}
    for change, message in bad.values():
        with pytest.raises(ConfigError, match=message):
            check_vllm({**frag, **change})


@pytest.mark.parametrize("entries, message", [
    ([[1, 4, 1, 99, 3]], "starts at 1, expected 0"),
    ([[1, 4, 0, 99, 3], [1, 4, 200, 300, 2]], "starts at 200, expected 100"),
    ([[1, 4, 0, 99, 3], [6, 8, 0, 99, 3]], "starts at 6"),
    ([[1, 4, 50, 9, 3]], "ctx_lo 50 > ctx_hi 9"),
    ([[1, 4, 3]], "must be \\(bs_lo, bs_hi, ctx_lo, ctx_hi, K\\)"),
    ([[1, 4, 0, 99, 8]], "K 8 > num_speculative_tokens 5"),
])
def test_vllm_context_rules(entries, message):
    good = [[1, 4, 0, 99, 5], [5, 64, 0, 99, 2], [1, 2, 100, 4096, 3], [3, 64, 100, 4096, 0]]
    check_vllm_context({"num_speculative_tokens": 5, "num_speculative_tokens_per_batch_size": good})
    with pytest.raises(ConfigError, match=message):
        check_vllm_context({"num_speculative_tokens": 5, "num_speculative_tokens_per_batch_size": entries})


@pytest.mark.parametrize("change, message", [
    ({"synthetic_acceptance_rates": [0.9, 0.95, 0.5]}, "non-increasing"),
    ({"synthetic_acceptance_rates": [0.9, 0.5]}, "list of 3"),
    ({"synthetic_acceptance_rates": [1.2, 0.5, 0.1]}, "in \\[0, 1\\]"),
    ({"rejection_sample_method": "standard"}, "must be 'synthetic'"),
])
def test_synthetic_rules(change, message):
    good = {"num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [0.9, 0.7, 0.7]}
    check_synthetic(good)
    with pytest.raises(ConfigError, match=message):
        check_synthetic({**good, **change})


def test_trtllm_and_sglang_rules():
    assert trtllm_schedule([(1, 2, 3), (3, 11, 5), (12, 16, 0)]) == [(1, 11, 3)]
    frag = {"max_draft_len": 7, "draft_len_schedule": {"2": 7, "11": 5}, "acceptance_rate_window_size": 64,
            "acceptance_rate_threshold": 0.3}
    check_trtllm(frag)
    for change, message in (({"max_draft_len": 5}, r"draft_len_schedule\[2\] = 7 > max_draft_len 5"),
                            ({"draft_len_schedule": {"2": 5, "11": 5}}, "must equal max_draft_len 7"),
                            ({"draft_len_schedule": {"0": 7}}, "key must be an integer >= 1"),
                            ({"draft_len_schedule": {}}, "non-empty"),
                            ({"acceptance_rate_window_size": 0}, "window_size must be an integer >= 1"),
                            ({"acceptance_rate_threshold": 1.5}, "threshold must be a number in")):
        with pytest.raises(ConfigError, match=message):
            check_trtllm({**frag, **change})
    check_sglang({"1": {"candidate_steps": [1, 3, 7]}, "32": {"candidate_steps": [0]}, "ema_alpha": 0.2})
    with pytest.raises(ConfigError, match="integer-string batch-size key"):
        check_sglang({"candidate_steps": [1, 3, 7]})
    for steps in ([], [-1], [True], ["3"], None):
        with pytest.raises(ConfigError, match=r"\[1\].candidate_steps"):
            check_sglang({"1": {"candidate_steps": steps}})
    with pytest.raises(ConfigError, match="unknown key 'speculative_num_steps'"):
        check_trtllm({**frag, "speculative_num_steps": 3})


# SGLang 0.5.23's documented adaptive keys and their defaults (AdaptiveStepSlot.__init__, DEFAULT_ADAPTIVE_CONFIG):
# the default file itself must pass, and a wrong type of each key must be refused, naming it.
SGLANG_DEFAULT = {"1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25,
                        "ceiling_coeff": 0},
                  "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
                  "64": {"candidate_steps": [0]}, "ema_alpha": 0.2, "update_interval": 5, "warmup_batches": 10}


@pytest.mark.parametrize("where, key, bad", [
    ("", "ema_alpha", 0.0), ("", "ema_alpha", 1.5), ("", "ema_alpha", "0.2"), ("", "update_interval", 0),
    ("", "update_interval", 2.5), ("", "warmup_batches", -1), ("", "warmup_batches", True),
    ("1", "down_hysteresis", "low"), ("1", "up_hysteresis", float("nan")), ("8", "ceiling_coeff", -1),
    ("", "ema", 0.2), ("1", "steps", [3])])
def test_sglang_keys_by_their_documented_types(where, key, bad):
    check_sglang(SGLANG_DEFAULT)
    config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in SGLANG_DEFAULT.items()}
    (config[where] if where else config)[key] = bad
    with pytest.raises(ConfigError, match=rf"^{re.escape(f'[{where}].' if where else '')}{key}"):
        check_sglang(config)


def test_trtllm_schedule_routes_like_bisect_left(result):
    """TensorRT-LLM looks K up with bisect_left over the sorted integer keys (K = 0 past the largest): every
    batch size of the tuned ranges gets the tuned K, clamped to the first range's (module note), and the payload
    holds only TensorRT-LLM's keys with their types (dict[int, int] once its JSON keys are read as integers)."""
    ranges = [tuple(r) for r in result["schedule"]["ranges"]]
    trt = result["trtllm"]
    assert set(trt) <= set(TRTLLM_KEYS) and isinstance(trt["max_draft_len"], int)
    schedule = {int(b): k for b, k in trt["draft_len_schedule"].items()}
    assert all(isinstance(k, int) for k in schedule.values())
    keys = sorted(schedule)
    first = ranges[0][2]
    for b in range(1, ranges[-1][1] + 3):
        i = bisect.bisect_left(keys, b)
        got = schedule[keys[i]] if i < len(keys) else 0
        tuned = next((k for lo, hi, k in ranges if lo <= b <= hi), None)
        assert got == (min(tuned, first) if tuned is not None and b <= keys[-1] else 0), (b, schedule, ranges)
    assert isinstance(trt["acceptance_rate_threshold"], float) and 0 <= trt["acceptance_rate_threshold"] <= 1
    assert isinstance(trt["acceptance_rate_window_size"], int) and trt["acceptance_rate_window_size"] >= 16


def test_context_bands_are_each_a_tune_at_their_context(trace):
    from avkit.tune.context import at_context, band_bounds

    assert band_bounds((2047, 65535)) == [(0, 2047), (2048, 65535)]
    assert at_context("roofline:H200:8b", 100) == "roofline:H200:8b:context=100"
    assert at_context("roofline:H200:8b:1b:context=8192,drafter=parallel", 7) == \
        "roofline:H200:8b:1b:drafter=parallel,context=7"
    for bad, message in (((2047, 2047), "ascending distinct"), ((0,), "ascending distinct")):
        with pytest.raises(ConfigError, match=message):
            band_bounds(bad)
    with pytest.raises(ConfigError, match="measured at one context"):
        at_context("bench/results/vllm_cost_cpu.json", 100)
    fast = dict(concurrency=(1, 16), bootstrap=10, max_k=3)
    doc = tune([trace], TuneConfig(context=1024, cost="roofline:H200:8b", context_bands=(2047, 65535), **fast))
    s = doc["schedule"]
    alone = tune([trace], TuneConfig(context=33791, cost="roofline:H200:8b:context=33791", **fast))
    assert s["context_ranges"][1] == [2048, 65535, alone["schedule"]["ranges"]]  # the band's middle: 33791
    assert [b["context"] for b in s["bands"]] == [1023, 33791]
    entries = [[lo, hi, c_lo, c_hi, k] for c_lo, c_hi, rs in s["context_ranges"] for lo, hi, k in rs]
    assert check_vllm_context(doc["vllm_context"])["num_speculative_tokens_per_batch_size"] == entries
    k_by = [{r["concurrency"]: r["k"] for r in b_doc} for b_doc in
            ([{"concurrency": c, "k": k} for c, k in b["k"].items()] for b in s["bands"])]
    assert s["context_changes"] == [{"concurrency": c, "k_by_band": [m.get(c) for m in k_by]}
                                    for c in (1, 16) if len({m.get(c) for m in k_by}) > 1]


def test_context_bands_move_a_profiled_table_by_its_context_input(trace, tmp_path):
    """A profiled table with kv_ms_per_token takes the band's context: moved(table, C) prices every step as the
    table's own context input does with n x C cached tokens (the oracle: CostTable.step_cost), and a band's
    run is `tune` on that moved table."""
    from dataclasses import replace

    from avkit.tune.context import at_context, moved

    table = CostTable.load("bench/results/vllm_cost_cpu.json")
    assert table.context_len == 32 and table.kv_ms_per_token == 0
    with pytest.raises(ConfigError, match="measured at one context"):
        at_context("bench/results/vllm_cost_cpu.json", 1000, tmp_path)
    kv = replace(table, kv_ms_per_token=0.02)
    path = str(kv.save(tmp_path / "kv.json"))
    n = np.arange(1, 40, dtype=np.float64)  # inside and beyond the requests grid (1-16)
    top = int(table.meta["k"])  # the profile's layout: T = n (K + 1), where its verify curve held n x context_len
    for k in (0, 3, top):
        t = n * (k + 1)
        held = kv.held_context(n, t)  # what the table's verify curve held at T: n x 32 at the profile's layout
        if k == top:
            assert (held == n * 32).all()
        for c in (32, 1000, 40000):
            np.testing.assert_allclose(moved(kv, c).step_cost(n, k, t) - kv.kv_ms_per_token * (held - n * 32),
                                       kv.step_cost(n, k, t, context_tokens=n * c), rtol=1e-12)
    with pytest.raises(ConfigError, match="below the 32 tokens"):
        at_context(path, 31, tmp_path)
    fast = dict(concurrency=(1, 16), bootstrap=10, max_k=3)
    doc = tune([trace], TuneConfig(context=1024, cost=path, context_bands=(1023, 65535), **fast))
    s = doc["schedule"]
    assert [b["context"] for b in s["bands"]] == [511, 33279]
    assert [r[:2] for r in s["context_ranges"]] == [[0, 1023], [1024, 65535]]
    alone = tune([trace], TuneConfig(context=33279, cost=at_context(path, 33279, tmp_path), **fast))
    assert s["context_ranges"][1][2] == alone["schedule"]["ranges"]  # the long band: the moved table's tune
    assert s["context_changes"], s["bands"]  # 33k cached tokens per request cost this CPU seconds: K changes
