"""Results files record their inputs and `avkit report` names stale or mismatched ones (issue 22 item 1);
JSON outputs never hold bare NaN (item 6); hvd finds a vocabulary for the structure features or says
it has none."""

import json
import shutil

import numpy as np
import polars as pl
import pytest
from conftest import write_trace_pair

from avkit.config import ReportConfig, SimulateConfig, SyntheticConfig
from avkit.jsonsafe import dumps, json_safe
from avkit.provenance import describe, file_sha256, inputs_record, trace_mismatch, trace_records
from avkit.report import report_traces
from avkit.scheduling.cost import resolve_cost
from avkit.sim.replay import read_inputs, results_inputs, simulate, write_results
from avkit.staged import write_json_atomic

SMALL = SyntheticConfig(num_slots=6_000, datasets=("code", "chat"), mix=(1, 1), feature_means=(2.0, 0.5),
                        steps_per_request=24, seed=5)
NOWHERE = ReportConfig(sim="/nonexistent/sim.parquet", hvd="/nonexistent/hvd.json", embed=False)
POLICIES = ["nospec", "fixed:2", "adaptive:qmax"]


def test_json_safe_writes_null_for_nan_and_numpy_scalars():
    blob = {"precision": float("nan"), "n": np.int64(4), "xs": np.array([0.5, np.inf]), "ok": 1.25}
    text = dumps(blob)
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"precision": None, "n": 4, "xs": [0.5, None], "ok": 1.25}
    assert json_safe((1.0, float("-inf"))) == [1.0, None]


def test_atomic_json_writes_null_for_nan(tmp_path):
    # tune.json and serve's snapshots go through write_json_atomic: the same rule as every other JSON output
    out = write_json_atomic(tmp_path / "t.json", {"gain": float("nan"), "k": np.int64(3)})
    assert json.loads(out.read_text()) == {"gain": None, "k": 3}


def test_record_hashes_file_content(tmp_path):
    a = tmp_path / "a.parquet"
    a.write_bytes(b"one")
    rec = inputs_record("avkit simulate", [a], cost={"spec": "roofline:H200:8b"})
    import hashlib
    assert rec["traces"][0]["sha256"] == hashlib.sha256(b"one").hexdigest()
    assert rec["command"] == "avkit simulate" and rec["avkit_version"]
    same = trace_records([a])
    assert trace_mismatch(rec, same, "X") == ""
    a.write_bytes(b"two")  # re-recorded under the same name
    msg = trace_mismatch(rec, trace_records([a]), "The simulation results")
    assert "stale" in msg and "a.parquet" in msg and file_sha256(a)[:8] in msg
    b = tmp_path / "b.parquet"
    b.write_bytes(b"three")
    assert "other traces" in trace_mismatch(rec, trace_records([b]), "X")
    assert "records no inputs" in describe(None)
    assert "roofline:H200:8b" in describe(rec) and "a.parquet" in describe(rec)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return write_trace_pair(tmp_path_factory.mktemp("prov"), SMALL, other_seed=6)


def _sim(paths, out, cost="roofline:H200:8b"):
    config = SimulateConfig(concurrency=(1, 8), cost=cost)
    table = resolve_cost(cost)
    df = simulate(paths, table, config.concurrency, POLICIES, config=config)
    return write_results(df, out, inputs=results_inputs(paths, table, config, POLICIES))


def test_simulate_results_carry_their_inputs(traces):
    root, one, _ = traces
    path = _sim([one], root / "sim.parquet")
    rec = read_inputs(path)
    assert rec["traces"][0]["sha256"] == file_sha256(one)
    assert rec["cost"]["spec"] == "roofline:H200:8b" and rec["cost"]["source"] == "roofline"
    assert rec["policies"] == POLICIES and rec["concurrency"] == [1, 8]
    assert pl.read_parquet(path).height == 2 * len(POLICIES)  # the table itself is unchanged


def test_report_names_a_simulation_of_other_traces_and_another_cost(traces):
    root, one, two = traces
    sim = _sim([two], root / "other.parquet", cost="roofline:H100:70b")
    warnings = []
    out = report_traces([one], root / "r1", NOWHERE, sim=sim, warn=warnings.append)
    html, md = (out / "index.html").read_text(), (out / "report.md").read_text()
    assert any("two.parquet" in w and "other traces" in w for w in warnings)
    assert any("roofline:H100:70b" in w for w in warnings)
    for page in (html, md):
        assert "other traces than this report" in page and "roofline:H100:70b" in page
        assert "Inputs: avkit simulate" in page  # shown beside the simulation section
    fit = json.loads((out / "fit" / "coefficients.json").read_text())
    assert fit["trained_on"]["inputs"]["traces"][0]["sha256"] == file_sha256(one)


def test_report_of_matching_results_has_no_warning_and_shows_the_hashes(traces):
    root, one, _ = traces
    sim = _sim([one], root / "match.parquet", cost=SimulateConfig().cost)  # the default cost model: no warning
    warnings = []
    out = report_traces([one], root / "r2", NOWHERE, sim=sim, warn=warnings.append)
    html = (out / "index.html").read_text()
    assert warnings == []
    assert file_sha256(one)[:8] in html and "matching this report" in html


def test_report_names_results_without_a_record(traces, tmp_path):
    _, one, _ = traces
    sim = simulate([one], resolve_cost("roofline:H200:8b"), (1,), POLICIES)
    write_results(sim, tmp_path / "old.parquet")  # no inputs: as written before they were recorded
    warnings = []
    report_traces([one], tmp_path / "r", NOWHERE, sim=tmp_path / "old.parquet", warn=warnings.append)
    assert any("records no inputs" in w for w in warnings)


def test_token_classes_fall_back_to_the_shipped_table(tmp_path, monkeypatch):
    """No local model: the table shipped for the trace's target (by sha256) is used; an unknown target
    gets none and a sentence saying what was left out and how to add it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from avkit.hvd import features

    monkeypatch.setenv("AVKIT_MODELS_DIR", str(tmp_path / "no-models"))
    shipped = sorted(features.SHIPPED.glob("*.npz"))
    assert shipped, "a class table ships for the shipped traces' target"
    sha = shipped[0].stem + "0" * 48
    t = pa.table({"x": [1]})
    pq.write_table(t.replace_schema_metadata({"avkit.target": "qwen2.5-coder-1.5b", "avkit.target_sha256": sha}),
                   tmp_path / "a.parquet")
    got = features.token_classes_for([tmp_path / "a.parquet"])
    assert got.table is not None and got.table.shape[1] == 5 and "shipped" in got.source
    assert got.table[:, 0].mean() > 0.5  # most of a BPE vocabulary is identifier-like
    pq.write_table(t.replace_schema_metadata({"avkit.target": "mystery-7b", "avkit.target_sha256": "ab" * 32}),
                   tmp_path / "b.parquet")
    none = features.token_classes_for([tmp_path / "b.parquet"])
    assert none.table is None and "LEFT OUT" in none.source and "avkit models fetch" in none.source
    assert features.token_classes_for([tmp_path / "a.parquet"], "none").table is None


def test_hvd_metrics_json_is_strict_json(tmp_path):
    from avkit.config import PayoffConfig
    from avkit.hvd.fit import fit_hvd_generations
    from avkit.hvd.replay import synthetic_generations

    fit_hvd_generations(synthetic_generations(8, seed=1, output_len=60), tmp_path,
                        payoff_config=PayoffConfig(epochs=1), ablation=False)
    text = (tmp_path / "hvd_metrics.json").read_text()
    assert "NaN" not in text
    json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in hvd_metrics.json"))
    shutil.rmtree(tmp_path)


def test_report_names_a_simulation_of_a_subset_of_its_traces(traces):
    root, one, two = traces
    sim = _sim([one], root / "subset.parquet")
    warnings = []
    report_traces([one, two], root / "r3", NOWHERE, sim=sim, warn=warnings.append)
    assert any("1 of this report's 2 traces" in w for w in warnings)
