"""Synthetic traces: censoring rules, known truth, determinism, controllable K and mix."""

import json

import numpy as np
import polars as pl
import pytest

from avkit.config import SyntheticConfig
from avkit.errors import ConfigError
from avkit.trace.reader import read_traces, trace_metadata
from avkit.trace.synthetic import synthetic_trace, write_synthetic_trace


def _frame(cfg):
    return pl.from_arrow(synthetic_trace(cfg))


def test_censoring_follows_the_first_rejection():
    df = _frame(SyntheticConfig(num_slots=35_000, k=5, intercepts=(1.0, 0.5, 0.2, 0.0, -0.2), seed=2,
                                trim_prob=0.3))
    pos, nacc, nver = (df[c].cast(pl.Int64).to_numpy() for c in ("position", "num_accepted", "num_verified"))
    acc, ver = df["accepted"], df["verified"].to_numpy()
    observed = acc.is_not_null().to_numpy()
    np.testing.assert_array_equal(ver, pos < nver)
    np.testing.assert_array_equal(observed, ver & (pos <= nacc))  # verified and at or before the rejection
    a = acc.fill_null(False).to_numpy()
    np.testing.assert_array_equal(a[observed], pos[observed] < nacc[observed])  # accepted prefix, then a reject
    per_step = df.group_by("request_id", "step").agg(pl.col("accepted").fill_null(False).sum(), pl.first("num_accepted"))
    assert (per_step["accepted"] == per_step["num_accepted"].cast(pl.UInt32)).all()
    assert 0 < (~ver).mean() < 0.3  # trimming censors some verified-prefix tails


def test_batch_fit_recovers_known_truth():
    import statsmodels.api as sm  # lazy: heavy, imported by the tests that use it
    cfg = SyntheticConfig(num_slots=140_000, seed=4)
    df = _frame(cfg).filter(pl.col("accepted").is_not_null())
    design = np.column_stack([df["logit_qmax"].to_numpy(), np.eye(cfg.k)[df["position"].to_numpy()]])
    glm = sm.GLM(df["accepted"].cast(pl.Float64).to_numpy(), design, family=sm.families.Binomial()).fit()
    z = (glm.params - np.r_[cfg.slope, cfg.intercepts]) / glm.bse
    assert np.abs(z).max() < 4.5  # the MLE sits within 4.5 standard errors of the truth, every coefficient


def test_layout_k_mix_and_metadata(tmp_path):
    cfg = SyntheticConfig(num_slots=10_001, k=3, intercepts=(0.5, 0.2, 0.0), datasets=("a", "b", "c"),
                          mix=(0.6, 0.3, 0.1), feature_means=(1.0, 0.0, -1.0), batch_size=4, seed=7)
    path = write_synthetic_trace(tmp_path / "s.parquet", cfg)
    df = read_traces([path])
    assert df.height == 10_001 and df["position"].max() == 2
    assert df["batch_size"].max() == 4 and (df["num_drafted"] == 3).all()
    steps = df.group_by("engine_step").agg(pl.col("request_id").n_unique())
    assert (steps["request_id"] <= 4).all()
    share = df.group_by("request_id").agg(pl.first("dataset"))["dataset"].cast(pl.String).value_counts(normalize=True)
    got = dict(zip(share["dataset"], share["proportion"]))
    assert got["a"] == pytest.approx(0.6, abs=0.15) and got["c"] < got["b"] < got["a"]
    meta = trace_metadata(path)
    assert json.loads(meta["avkit.synthetic"])["intercepts"] == [0.5, 0.2, 0.0]
    assert meta["avkit.schema_version"] == "1" and meta["avkit.k"] == "3"


def test_seeded_determinism():
    a, b = synthetic_trace(SyntheticConfig(num_slots=2000, seed=5)), synthetic_trace(SyntheticConfig(num_slots=2000, seed=5))
    c = synthetic_trace(SyntheticConfig(num_slots=2000, seed=6))
    assert a.equals(b) and not a.equals(c)


def test_config_validation():
    with pytest.raises(ConfigError, match="--intercepts must have 3 entries"):
        SyntheticConfig(k=3)
