"""bench/adaptive_live.py: the live benchmark protocol runs end to end on tiny random models (`--tiny`),
and its two rules (tokens/s from a generations table, the paired ratio's interval) match oracles."""

import json
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

import adaptive_live  # noqa: E402


def test_tokens_per_second_from_the_generations_table():
    gens = pl.DataFrame({"output_ids": [[1] * 11, [2] * 21, [3]], "admitted_s": [0.0, 1.0, 2.0],
                         "first_token_s": [0.5, 2.0, 3.0], "last_token_s": [2.5, 6.0, 3.0]})
    got = adaptive_live.run_tokens_s(gens, concurrency=2)
    assert got["tok_s"] == pytest.approx(33 / 6.0)  # every token over the run's span, prefills included
    assert got["decode_tok_s"] == pytest.approx(2 * (10 + 20) / (2.0 + 4.0))  # one-token requests excluded
    assert got["new_tokens"] == pytest.approx(11.0)


def test_paired_ratio_is_a_t_interval_over_log_ratios():
    from scipy import stats

    rng = np.random.default_rng(0)
    b = rng.uniform(10, 20, 5)
    a = b * np.exp(rng.normal(0.02, 0.01, 5))
    got = adaptive_live.paired_ratio(a, b)  # bench/common.py's, as the script uses it
    ci = stats.ttest_1samp(np.log(a / b), 0.0).confidence_interval(0.95)
    assert got["ratio"] == pytest.approx(np.exp(np.log(a / b).mean()))
    assert (got["lo"], got["hi"]) == pytest.approx((np.exp(ci.low), np.exp(ci.high)))


def test_tiny_protocol_runs_through_the_cli(tmp_path):
    out = tmp_path / "al.md"
    assert adaptive_live.main(["--tiny", "--out", str(out)]) == 0
    c1, c2, mix = json.loads(out.with_suffix(".json").read_text())  # c = 1, c = 2, their equal-time mix
    assert (c1["concurrency"], c2["concurrency"], mix["concurrency"]) == (1, 2, "mixed")
    for cell in (c1, c2, mix):
        assert set(cell["runs"]) == {"fixed:0", "fixed:2", "adaptive-stop:online_logistic"}
        assert all(len(runs) == 3 for runs in cell["runs"].values())  # three interleaved repeats
        for metric in ("decode_tok_s", "tok_s"):
            r = cell[metric]
            assert r["best_fixed"] in ("fixed:0", "fixed:2") and 0 < r["lo"] <= r["ratio"] <= r["hi"]
    for p, runs in mix["runs"].items():  # each repeat's mix is the mean of that repeat's two cells
        for r, run in enumerate(runs):
            assert run["decode_tok_s"] == pytest.approx((c1["runs"][p][r]["decode_tok_s"] +
                                                         c2["runs"][p][r]["decode_tok_s"]) / 2)
    assert "adaptive-stop:online_logistic / best fixed K" in out.read_text()
