"""`avkit report` on the command line: FIT_DIR or traces, the embedded default (shipped traces in
./traces), option plumbing, and one-line errors (exit 2) that leave --out untouched."""

import json
from pathlib import Path

import pytest

import avkit.report
from conftest import run_cli
from avkit.config import EstimatorConfig, FitConfig, ReportConfig, SyntheticConfig
from avkit.errors import ConfigError
from avkit.trace.synthetic import write_synthetic_trace


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return write_synthetic_trace(tmp_path_factory.mktemp("cli") / "traces/t.parquet", SyntheticConfig(num_slots=3_500))


def _run(capsys, *args) -> tuple[int, str, str]:
    return run_cli(capsys, "report", *args)


def test_default_fits_the_shipped_traces(capsys, trace, monkeypatch):
    """No argument: ./traces/*.parquet is fitted, simulated (no results file yet) and reported."""
    monkeypatch.chdir(trace.parent.parent)
    code, out, err = _run(capsys)
    assert code == 0, err
    report = trace.parent.parent / ReportConfig().out
    assert f"wrote {ReportConfig().out}/index.html" in out
    coef = json.loads((report / "fit/coefficients.json").read_text())
    assert [Path(p).resolve() for p in coef["trained_on"]["traces"]] == [trace.resolve()]
    html = (report / "index.html").read_text()
    assert '<section id="simulation">' in html and "simulated now" in html and (report / "simulate.parquet").is_file()
    assert "Omitted: no reports/hvd/hvd_metrics.json yet" in html


def test_options_reach_the_library(capsys, trace, tmp_path, monkeypatch):
    seen = {}

    def fake(*args, **kwargs):
        seen.update(args=args, kwargs=kwargs)
        raise ConfigError("stop here")

    monkeypatch.setattr(avkit.report, "report_traces", fake)
    monkeypatch.setattr(avkit.report, "report_fit_dir", fake)
    code, _, err = _run(capsys, trace, "--out", tmp_path / "r", "--mode", "batch", "--feature", "entropy",
                        "--bins", "15", "--no-simulate", "--no-embed", "--sim", tmp_path / "s.parquet")
    assert code == 2 and err == "avkit: error: stop here\n"
    assert seen["args"] == ([trace], tmp_path / "r", ReportConfig(out=str(tmp_path / "r"), bins=15,
                                                                  embed=False))
    assert seen["kwargs"]["fit"] == FitConfig(mode="batch", bins=15)
    assert seen["kwargs"]["estimator"] == EstimatorConfig(feature="entropy")
    assert seen["kwargs"]["sim"] == tmp_path / "s.parquet" and seen["kwargs"]["run_simulation"] is False
    code, _, _ = _run(capsys, tmp_path, "--hvd", tmp_path / "h.json")
    assert code == 2 and seen["args"][0] == tmp_path and seen["kwargs"]["hvd"] == tmp_path / "h.json"


@pytest.mark.parametrize("case", ["dir and file", "missing trace", "fit dir without scores", "bad feature"])
def test_bad_input_is_one_line_and_leaves_out_alone(capsys, trace, tmp_path, case):
    out = tmp_path / "r"
    out.mkdir()
    (out / "index.html").write_text("previous")
    args = {"dir and file": [tmp_path, trace], "missing trace": [tmp_path / "nope.parquet"],
            "fit dir without scores": [tmp_path], "bad feature": [trace, "--feature", "q_sampled_typo"]}[case]
    message = {"dir and file": "give one FIT_DIR or trace files", "missing trace": "nope.parquet: no such trace file",
               "fit dir without scores": "no coefficients.json", "bad feature": "q_sampled_typo"}[case]
    code, _, err = _run(capsys, *args, "--out", out)
    assert code == 2 and err.startswith("avkit: error: ") and err.count("\n") == 1, err
    assert message in err
    assert (out / "index.html").read_text() == "previous"
