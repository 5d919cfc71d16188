"""`avkit report --engine streaming`: a sharded trace set reported out of core shows the same
numbers as the in-memory report (acceptance per dataset and position exactly, reliability bins and
the per-dataset fits within the fits' 1e-9), never reads a trace whole (each shard in chunks of
the budget's rows), and a CLI run writes the report; an online fit is refused in one line."""

import numpy as np
import pytest

import avkit.report.traces
import avkit.trace.reader
from avkit.cli import app
from avkit.config import FitConfig, ReportConfig, SyntheticConfig
from avkit.fit import run_fit, write_fit_outputs
from avkit.fit.passes import chunk_rows
from avkit.report.inputs import load_fit_dir, load_inputs
from avkit.report.sections.reliability import reliability_bins
from avkit.trace.synthetic import write_synthetic_trace

TINY = ReportConfig(engine="streaming", memory_budget=256)  # chunks of 32K rows: several per shard


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("fleet")
    cfg = dict(num_slots=70_000, datasets=("code", "chat", "tool"), mix=(1, 1, 1), feature_means=(2.5, 1.0, 0.0))
    for i in range(3):
        write_synthetic_trace(d / f"replica-{i}.parquet", SyntheticConfig(**cfg, seed=i))
    return d


@pytest.fixture(scope="module")
def fitted(shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("fit") / "fit"
    write_fit_outputs(out, run_fit([shards], FitConfig(mode="batch")))
    return load_fit_dir(out)


@pytest.fixture(scope="module")
def both(fitted, shards):
    paths = sorted(shards.glob("*.parquet"))
    return load_inputs(fitted, paths), load_inputs(fitted, paths, TINY)


def test_acceptance_tables_equal_in_memory(both):
    mem, out = both[0].summary, both[1].summary
    assert mem.names == out.names
    np.testing.assert_array_equal(out.counts, mem.counts)
    np.testing.assert_array_equal(out.accepted, mem.accepted)
    assert out.drafts.keys() == mem.drafts.keys()
    for name, d in mem.drafts.items():
        assert out.drafts[name]["slots"] == d["slots"]
        assert abs(out.drafts[name]["entropy"] - d["entropy"]) <= 1e-9


def test_reliability_bins_and_role_fits_equal_in_memory(both):
    mem, out = both[0].summary, both[1].summary
    assert [p[:4] for p in mem.panels] == [p[:4] for p in out.panels]
    for (*_, sm), (*_, ss) in zip(mem.panels, out.panels):
        bm, bs = reliability_bins(sm), reliability_bins(ss)
        np.testing.assert_array_equal(bs["count"], bm["count"])
        np.testing.assert_allclose(bs["pred"], bm["pred"], rtol=0, atol=1e-9)
        np.testing.assert_allclose(bs["rate"], bm["rate"], rtol=0, atol=1e-12)
    fits_m, fits_s = mem.role_fits, out.role_fits
    assert [f["dataset"] for f in fits_s] == [f["dataset"] for f in fits_m] and len(fits_m) == 3
    for a, b in zip(fits_s, fits_m):
        assert a["n"] == b["n"] and abs(a["slope"] - b["slope"]) <= 1e-9 and abs(a["b0"] - b["b0"]) <= 1e-9
        assert abs(a["rate"] - b["rate"]) <= 1e-12 and abs(a["entropy"] - b["entropy"]) <= 1e-9


def test_no_trace_is_read_whole(fitted, shards, monkeypatch):
    def whole(*a, **k):
        raise AssertionError("an out-of-core report read a trace whole")

    monkeypatch.setattr(avkit.trace.reader, "read_traces", whole)
    monkeypatch.setattr(avkit.report.traces, "load_fit_data", whole)
    inputs = load_inputs(fitted, sorted(shards.glob("*.parquet")), TINY)
    rows = chunk_rows(TINY.streaming())
    assert rows < 70_000  # every shard went through in several chunks of at most `rows` rows
    assert inputs.summary.counts.sum() == fitted.coefficients["trained_on"]["observed"]


def test_cli_reports_a_shard_directory_out_of_core(capsys, shards, tmp_path):
    with pytest.raises(SystemExit) as e:
        app(["report", str(shards), "--engine", "streaming", "--mode", "batch", "--memory-budget", "256",
             "--scratch", str(tmp_path / "scratch"), "--no-simulate", "--out", str(tmp_path / "out")], prog_name="avkit")
    assert e.value.code == 0, capsys.readouterr().err
    html = (tmp_path / "out" / "index.html").read_text()
    assert "Reliability diagrams" in html and "acceptance rate" in html
    assert not list((tmp_path / "scratch").iterdir())  # spills removed


def test_online_fit_out_of_core_is_one_line(capsys, shards, tmp_path):
    with pytest.raises(SystemExit) as e:
        app(["report", str(shards), "--engine", "streaming", "--out", str(tmp_path / "out")], prog_name="avkit")
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("avkit: error: ") and err.count("\n") == 1, err
    assert "--mode batch" in err and not (tmp_path / "out").exists()
