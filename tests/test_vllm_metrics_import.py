"""`avkit import vllm-metrics`: vLLM's Prometheus spec-decode counters -> acceptance profile -> `simulate --profile`.

The oracle is a brute-force count over a seeded list of accepted lengths: the per-position conditional
acceptance, the survival and the mean accepted length of that list. The Prometheus text is written by
vLLM's own `SpecDecodingProm` in vLLM's venv (marker `vllm`), and, in every CI run, by prometheus_client
with the metric and label names vLLM 0.32 uses (vllm/v1/spec_decode/metrics.py): two engines, one model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from vllm_support import need_vllm, vllm_env

from avkit.engines.vllm.metrics import acceptance_profile, parse_counters
from avkit.tune.acceptance import wilson
from avkit.errors import DataError
from avkit.sim.steps import length_distribution, profile_steps

K = 5


def accepted_lengths(n=4000, seed=0) -> np.ndarray:
    """[n] accepted lengths of request-steps: a geometric-like walk with per-position rates."""
    rng = np.random.default_rng(seed)
    rates = np.array([0.8, 0.85, 0.9, 0.9, 0.95])
    ok = rng.random((n, K)) < rates  # [n, K]
    return np.where(ok.all(1), K, np.argmin(ok, axis=1))


def prometheus_text(lengths: np.ndarray) -> str:
    """The counters as vLLM exports them, split over two engines (even / odd steps)."""
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    drafts = Counter("vllm:spec_decode_num_drafts", "d", labels, registry=reg)
    tokens = Counter("vllm:spec_decode_num_draft_tokens", "t", labels, registry=reg)
    acc = Counter("vllm:spec_decode_num_accepted_tokens", "a", labels, registry=reg)
    per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "p", labels + ["position"], registry=reg)
    for e in (0, 1):
        part = lengths[e::2]
        drafts.labels("qwen", str(e)).inc(len(part))
        tokens.labels("qwen", str(e)).inc(K * len(part))
        acc.labels("qwen", str(e)).inc(int(part.sum()))
        for j in range(K):
            per_pos.labels("qwen", str(e), str(j)).inc(int((part > j).sum()))
    return generate_latest(reg).decode() + 'vllm:num_requests_running{engine="0"} 3.0\n'


def check_profile(profile: dict, lengths: np.ndarray) -> None:
    assert profile["kind"] == "aggregate" and profile["k"] == K and profile["full_drafts"]
    assert profile["num_drafts"] == len(lengths)
    assert profile["mean_accepted_length"] == pytest.approx(lengths.mean())
    for j, p in enumerate(profile["positions"]):
        reached = (lengths >= j).sum()  # brute force: steps that verified slot j after j accepts
        assert p["reached"] == reached and p["accepted"] == (lengths > j).sum()
        assert p["conditional"] == pytest.approx((lengths > j).sum() / reached)
        assert p["conditional_lo"] < p["conditional"] < p["conditional_hi"]
        assert p["survival"] == pytest.approx((lengths > j).mean())
    labelled = sum((lengths >= j).sum() for j in range(K))
    assert profile["per_slot_acceptance"] == pytest.approx(lengths.sum() / labelled)


def test_profile_from_prometheus_text_matches_brute_force():
    lengths = accepted_lengths()
    check_profile(acceptance_profile(parse_counters(prometheus_text(lengths), "t"), "t"), lengths)


def test_wilson_interval_against_statsmodels():
    from statsmodels.stats.proportion import proportion_confint

    for k, n in ((0, 10), (7, 10), (10, 10), (812, 1000)):
        assert wilson(k, n) == pytest.approx(proportion_confint(k, n, alpha=0.05, method="wilson"), abs=1e-9)


def test_bad_metrics_are_one_line_errors():
    with pytest.raises(DataError, match="no spec-decode counters"):
        parse_counters('vllm:num_requests_running{engine="0"} 3.0\n', "m.txt")
    two = prometheus_text(accepted_lengths(10)) + prometheus_text(accepted_lengths(10)).replace("qwen", "llama")
    with pytest.raises(DataError, match="several models"):
        parse_counters(two.replace("# HELP", "# x").replace("# TYPE", "# y"), "m.txt")


def test_cli_profile_then_simulate(tmp_path):
    lengths = accepted_lengths()
    (tmp_path / "metrics.txt").write_text(prometheus_text(lengths))
    env = {**os.environ}
    run = lambda *a: subprocess.run([sys.executable, "-m", "avkit", *a], capture_output=True, text=True, env=env,
                                    cwd=tmp_path, timeout=900)
    r = run("import", "vllm-metrics", "metrics.txt", "--out", "p.json")
    assert r.returncode == 0, r.stderr
    profile = json.loads((tmp_path / "p.json").read_text())
    check_profile(profile, lengths)
    # the replayed step rows have the profile's length distribution exactly (to 1 row in 20,000)
    steps = profile_steps(profile)
    pmf = np.bincount(steps.accepted, minlength=K + 1) / steps.accepted.size
    np.testing.assert_allclose(pmf, length_distribution(profile), atol=1 / steps.accepted.size)
    r = run("simulate", "--profile", "p.json", "--cost", "roofline:h200:8b", "--concurrency", "1,16",
            "--out", "sim.parquet")
    assert r.returncode == 0, r.stderr
    df = pl.read_parquet(tmp_path / "sim.parquet")
    assert set(df["policy"]) == {"nospec"} | {f"fixed{k}" for k in range(1, K + 1)}
    fixed = df.filter(pl.col("policy") == f"fixed{K}")
    assert fixed["mean_accepted"].to_list() == pytest.approx([lengths.mean()] * 2, abs=2e-3)
    r = run("simulate", "--profile", "p.json", "--policy", "adaptive:online_logistic", "--out", "x.parquet")
    assert r.returncode == 2 and r.stderr.startswith("avkit: error: --policy adaptive:online_logistic")


VLLM_PROM = """
import sys, types
sys.modules.update(torchvision=None, torchaudio=None, torchcodec=None)
import prometheus_client
from vllm.v1.spec_decode.metrics import SpecDecodingProm, SpecDecodingStats
lengths = [int(x) for x in sys.argv[1].split(",")]
prom = SpecDecodingProm(types.SimpleNamespace(num_speculative_tokens=5), ["model_name", "engine"],
                        {0: ["qwen", "0"], 1: ["qwen", "1"]})
for i, a in enumerate(lengths):
    s = SpecDecodingStats.new(5)
    s.observe_draft(num_draft_tokens=5, num_accepted_tokens=a)
    prom.observe(s, engine_idx=i % 2)
print(prometheus_client.generate_latest().decode())
"""


@pytest.mark.vllm
def test_profile_from_vllms_own_prometheus_exporter():
    vllm_python = need_vllm()
    lengths = accepted_lengths(600)
    r = subprocess.run([str(vllm_python), "-c", VLLM_PROM, ",".join(map(str, lengths))], capture_output=True,
                       text=True, timeout=600, env=vllm_env())
    assert r.returncode == 0, r.stderr[-3000:]
    check_profile(acceptance_profile(parse_counters(r.stdout, "vllm"), "vllm"), lengths)
