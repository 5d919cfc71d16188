"""`avkit fit` end to end: the three outputs, batch parity, option plumbing, and bad input
(one line on stderr naming the file, exit 2, nothing created or overwritten in --out)."""

import json

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import avkit.fit
from conftest import run_cli
from avkit.config import EstimatorConfig, FitConfig, SyntheticConfig
from avkit.errors import ConfigError
from avkit.estimators import make_estimator
from avkit.features import FEATURES
from avkit.trace.shards import shipped_traces
from avkit.trace.synthetic import synthetic_trace

K = 7


@pytest.fixture(scope="module")
def table():
    return synthetic_trace(SyntheticConfig(num_slots=28_000, seed=11))


@pytest.fixture
def trace(tmp_path, table):
    path = tmp_path / "trace.parquet"
    pq.write_table(table, path)
    return path


def _run(capsys, *args) -> tuple[int, str, str]:
    return run_cli(capsys, "fit", *args)


def test_online_outputs(capsys, trace, tmp_path):
    code, out, err = _run(capsys, trace, "--out", tmp_path / "o")
    assert code == 0, err
    coef = json.loads((tmp_path / "o/coefficients.json").read_text())
    assert {"schema_version", "feature", "num_positions", "slope", "intercepts", "observations", "mode",
            "trained_on"} <= set(coef)
    assert coef["schema_version"] == 1 and coef["feature"] == "logit_qmax" and coef["mode"] == "online"
    assert coef["num_positions"] == K and len(coef["intercepts"]) == K and len(coef["observations"]) == K
    assert sum(coef["observations"]) == coef["trained_on"]["observed"]
    scores = json.loads((tmp_path / "o/scores.json").read_text())
    assert set(scores[0]) == {"feature", "lossless", "estimator", "scope", "auc", "log_loss", "ece", "n"}
    assert {r["feature"] for r in scores} == set(FEATURES)
    assert {r["scope"] for r in scores} == ({"all", "all_but_first", "dataset=code", "dataset=chat"}
                                           | {f"position={i}" for i in range(K)})
    for r in scores:
        assert r["lossless"] is FEATURES[r["feature"]].lossless
    est = {(r["feature"], r["estimator"]) for r in scores}
    assert {("q_max", "qmax"), ("head_conf", "passthrough"), ("logit_qmax", "online_logistic"),
            ("logit_qmax", "per_position_slope")} <= est
    traj = pl.read_parquet(tmp_path / "o/trajectory.parquet")
    assert {"round", "engine_step", "file", "applied", "observations", "slope"} | {f"intercept_{i}" for i in range(K)} \
        == set(traj.columns)
    assert traj["engine_step"].is_sorted() and traj["observations"].sum() == coef["trained_on"]["observed"]
    engine_steps = 28_000 // K // 8  # 8 requests per engine step
    assert traj.height == -(-engine_steps // 100)  # one row per refit round of 100 engine steps
    assert traj["slope"][-1] == pytest.approx(coef["slope"])
    assert "logit_qmax" in out and "wrote" in out
    # coefficients.json is a state the runtime can warm-start the estimator from
    est = make_estimator("online_logistic", k=K)
    est.load_state_dict(coef)
    assert est.slope == coef["slope"] and est.intercepts.tolist() == coef["intercepts"]


def test_batch_matches_statsmodels(capsys, trace, tmp_path, table):
    import statsmodels.api as sm  # lazy: heavy, imported by the tests that use it
    code, _, err = _run(capsys, trace, "--out", tmp_path / "b", "--mode", "batch")
    assert code == 0, err
    coef = json.loads((tmp_path / "b/coefficients.json").read_text())
    df = pl.from_arrow(table).filter(pl.col("accepted").is_not_null())
    design = np.column_stack([df["logit_qmax"].to_numpy(), np.eye(K)[df["position"].to_numpy()]])
    glm = sm.GLM(df["accepted"].cast(pl.Float64).to_numpy(), design, family=sm.families.Binomial()).fit(tol=1e-12)
    # the ridge only regularises Newton steps, so the converged fit is the MLE
    np.testing.assert_allclose([coef["slope"], *coef["intercepts"]], glm.params, atol=1e-6)


def test_options_build_configs(capsys, trace, tmp_path, monkeypatch):
    seen = {}

    def fake_run_fit(paths, fit, est_cfg, progress=None):
        seen.update(paths=paths, fit=fit, est=est_cfg)
        raise ConfigError("stop here")

    monkeypatch.setattr(avkit.fit, "run_fit", fake_run_fit)
    code, _, err = _run(capsys, trace, "--out", tmp_path / "x", "--mode", "batch", "--feature", "entropy",
                        "--refit-interval", "7", "--bins", "15")
    assert code == 2 and err == "avkit: error: stop here\n"
    assert seen["paths"] == [trace]
    assert seen["fit"] == FitConfig(mode="batch", bins=15, out=str(tmp_path / "x"))
    assert seen["est"] == EstimatorConfig(feature="entropy", refit_interval=7)
    assert not (tmp_path / "x").exists()


def _set(t, name, values):
    return t.set_column(t.schema.get_field_index(name), name, values)


def _nan(t):
    v = t["logit_qmax"].to_numpy().copy()
    v[3] = np.nan
    return _set(t, "logit_qmax", pa.array(v, pa.float32()))


BAD = {
    "missing file": (None, "no such trace file"),
    "not parquet": (b"this is, a csv\n", "not a readable Parquet file"),
    "truncated": ("truncate", "not a readable Parquet file"),
    "wrong version": (lambda t: t.replace_schema_metadata({**t.schema.metadata, b"avkit.schema_version": b"9"}),
                      "schema_version is '9'"),
    "missing column": (lambda t: t.drop_columns(["entropy"]), "required column 'entropy' is missing"),
    "mistyped column": (lambda t: _set(t, "q_max", t["q_max"].cast(pa.string())), "column 'q_max' has type"),
    "nan feature": (_nan, "column 'logit_qmax' is not finite"),
    "position >= K": (lambda t: _set(t, "position", pc.add(t["position"], pa.scalar(1, pa.int16()))),
                      "column 'position' is >= K = 7"),
    "no observed labels": (lambda t: _set(t, "accepted", pa.nulls(t.num_rows, pa.bool_())), "no observed labels"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input(capsys, tmp_path, table, case):
    how, message = BAD[case]
    path = tmp_path / "bad.parquet"
    if callable(how):
        pq.write_table(how(table), path)
    elif how == "truncate":
        pq.write_table(table, path)
        path.write_bytes(path.read_bytes()[:5000])
    elif how is not None:
        path.write_bytes(how)
    out_dir = tmp_path / "out"
    code, _, err = _run(capsys, path, "--out", out_dir)
    assert code == 2
    assert err.startswith("avkit: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert message in err and (str(path) in err or (case == "no observed labels" and "bad.parquet" in err))
    assert not out_dir.exists()


@pytest.mark.parametrize("drafter, message", [("eagle", "drafter must be one of"),
                                              ("suffix", "no observed labels of drafter 'suffix'")])
def test_drafter_option_errors(capsys, tmp_path, trace, drafter, message):
    """--drafter names the rows fitted: a bad name, or a drafter the trace has no rows of, is one line."""
    code, _, err = _run(capsys, trace, "--out", tmp_path / "out", "--drafter", drafter)
    assert code == 2 and err.startswith("avkit: error: ") and err.count("\n") == 1
    assert message in err and drafter in err and not (tmp_path / "out").exists()


def test_existing_outputs_are_not_overwritten_on_error(capsys, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "coefficients.json").write_text("keep me")
    code, _, _ = _run(capsys, tmp_path / "nope.parquet", "--out", out_dir)
    assert code == 2 and (out_dir / "coefficients.json").read_text() == "keep me"
    assert sorted(p.name for p in out_dir.iterdir()) == ["coefficients.json"]


def test_lossy_or_unknown_feature_is_refused(capsys, trace, tmp_path):
    code, _, err = _run(capsys, trace, "--out", tmp_path / "o", "--feature", "logit_q_sampled")
    assert code == 2 and "lossy" in err
    code, _, err = _run(capsys, trace, "--out", tmp_path / "o", "--feature", "nope")
    assert code == 2 and "--feature must be one of" in err and err.strip().endswith("; got nope")
    assert not (tmp_path / "o").exists()


def test_features_fits_and_scores_only_those(capsys, trace, tmp_path):
    """--features: only the listed features are fitted and scored (no ablation), and what is written equals
    the default command's rows of those features: the same rows, the same Newton fixed point."""
    code, _, err = _run(capsys, trace, "--out", tmp_path / "all", "--mode", "batch")
    assert code == 0, err
    code, _, err = _run(capsys, trace, "--out", tmp_path / "one", "--mode", "batch", "--features", "q_max, logit_qmax")
    assert code == 0, err
    read = lambda d, name: json.loads((tmp_path / d / name).read_text())
    every, some = read("all", "scores.json"), read("one", "scores.json")
    assert {(r["feature"], r["estimator"]) for r in some} == {("logit_qmax", "batch_logistic"), ("q_max", "qmax")}
    assert some == [r for r in every if (r["feature"], r["estimator"]) in {("logit_qmax", "batch_logistic"),
                                                                            ("q_max", "qmax")}]
    a, b = read("all", "coefficients.json"), read("one", "coefficients.json")
    assert (a["slope"], a["intercepts"], a["trained_on"]["observed"]) == \
        (b["slope"], b["intercepts"], b["trained_on"]["observed"])


@pytest.mark.parametrize("given, extra, message", [
    ("nope", (), "--features must be one of"),
    ("entropy", (), "--features entropy: leaves out the written feature (--feature logit_qmax, coefficients.json)"),
    ("logit_qmax,logit_qmax", (), "--features logit_qmax,logit_qmax: names a feature twice"),
    (" , ", (), "--features must be comma-separated feature names, got ,"),
    ("logit_qmax,head_conf", ("no head_conf",), "--features head_conf: is not in the traces"),
])
def test_features_option_errors(capsys, tmp_path, table, given, extra, message):
    path = tmp_path / "t.parquet"
    pq.write_table(table.drop_columns(["head_conf"]) if extra else table, path)
    for engine in ("memory", "streaming"):
        code, _, err = _run(capsys, path, "--out", tmp_path / "out", "--mode", "batch", "--engine", engine,
                            "--features", given)
        assert code == 2 and err.startswith("avkit: error: ") and err.count("\n") == 1, err
        assert message in err and not (tmp_path / "out").exists()


def test_shipped_traces(tmp_path):
    with pytest.raises(ConfigError, match="no shipped traces"):
        shipped_traces((tmp_path,))
    (tmp_path / "traces").mkdir()
    for name in ("b.parquet", "a.parquet", "a.generations.parquet", "c.parquet.partial", "trajectory.parquet"):
        (tmp_path / "traces" / name).write_bytes(b"")
    assert [p.name for p in shipped_traces((tmp_path,))] == ["a.parquet", "b.parquet"]
