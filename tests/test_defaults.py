"""Every command with its defaults, as a user runs it: `python -m avkit COMMAND` in a fresh interpreter, from
a directory outside the clone (the shipped traces and cost table are found beside the package), each exits 0
with its result on stdout and nothing but progress and notes on stderr.

The commands that read the shipped traces run here: report (the README's first command, in an empty
directory: it fits and simulates now), fit, simulate, tune and hvd, then report again over what they wrote
(as a user who ran them would), datacard (its traces are a required argument: the shipped ones), models list
and --version. record, profile and serve with their defaults load the real model pair (`just test-slow`);
import vllm-metrics needs a vLLM /metrics URL or file. On an idle 2-core box this module takes about two
minutes of CPU: the default simulation is what a newcomer's first command costs, and it is kept whole.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from avkit.sim.replay import read_inputs

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p for p in (ROOT / "traces").glob("*.parquet") if not p.name.endswith(".generations.parquet"))


def avkit(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m avkit ARGS` in `cwd`, importing this checkout (as an editable install does)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "COLUMNS": "160"}
    done = subprocess.run([sys.executable, "-m", "avkit", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"avkit {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr and "avkit: error" not in done.stderr, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """The user's working directory: outside the clone, no traces/ and no reports/ yet."""
    where = tmp_path_factory.mktemp("user")
    assert ROOT not in where.parents
    return where


@pytest.fixture(scope="module")
def ran(home, tmp_path_factory) -> dict:
    """The independent commands, two at a time (each is mostly one thread; the box has two cores): report in an
    empty directory of its own (it must find no outputs of the others), fit, simulate, tune and hvd in `home`
    (none of them reads another's output). -> {command: future of its CompletedProcess, "first": that directory}."""
    first = tmp_path_factory.mktemp("first")
    pool = cf.ThreadPoolExecutor(2)
    runs = {"report": pool.submit(avkit, first, "report")}
    runs.update({c: pool.submit(avkit, home, c) for c in ("simulate", "tune", "hvd", "fit")})  # longest first
    pool.shutdown(wait=False)
    runs["first"] = first
    return runs


def test_report_first(ran):
    """The README's first command in an empty directory: fits and simulates the shipped traces now."""
    done, where = ran["report"].result(), ran["first"]
    assert "wrote reports/report/index.html" in done.stdout
    html = (where / "reports/report/index.html").read_text()
    assert '<section id="simulation">' in html and "simulated now" in html
    assert "what-if" not in html  # priced by the shipped CPU cost table, not a roofline
    fitted = json.loads((where / "reports/report/fit/coefficients.json").read_text())["trained_on"]["traces"]
    assert sorted(Path(p).name for p in fitted) == [p.name for p in SHIPPED]


def test_fit(home, ran):
    done = ran["fit"].result()
    assert "logit_qmax" in done.stdout and "AUC" in done.stdout
    assert {p.name for p in (home / "reports/fit").iterdir()} >= {"coefficients.json", "scores.json"}


def test_simulate(home, ran):
    done = ran["simulate"].result()
    assert "throughput, tokens/s" in done.stdout and "cost_cpu.json" in done.stdout
    sim = pl.read_parquet(home / "reports/simulate.parquet")
    assert sorted(sim["concurrency"].unique().to_list()) == [1, 2, 4, 8, 16]
    assert (sim["throughput_tok_s"] > 0).all()
    traces = read_inputs(home / "reports/simulate.parquet")["traces"]  # found beside the package
    assert sorted(Path(t["path"]).name for t in traces) == [p.name for p in SHIPPED]


def test_tune(home, ran):
    done = ran["tune"].result()
    assert "predicted tokens/s" in done.stdout
    assert json.loads((home / "reports/tune.json").read_text())["schedule"]["ranges"]


def test_hvd(home, ran):
    done = ran["hvd"].result()
    assert "HVD routers" in done.stdout
    assert (home / "reports/hvd/hvd_metrics.json").is_file()


def test_report_over_the_commands_outputs(home, ran):
    """After fit, simulate, tune and hvd: the report reads their files instead of omitting the sections."""
    for c in ("fit", "simulate", "tune", "hvd"):
        ran[c].result()
    done = avkit(home, "report")
    assert "wrote reports/report/index.html" in done.stdout
    html = (home / "reports/report/index.html").read_text()
    assert "simulated now" not in html and "Omitted: no reports/" not in html


def test_datacard_models_list_and_version(home):
    assert "rows (draft slots)" in avkit(home, "datacard", *map(str, SHIPPED)).stdout
    assert "qwen2.5-coder-1.5b" in avkit(home, "models", "list").stdout
    assert avkit(home, "--version").stdout.startswith("avkit ")
