"""`avkit tune` results record their inputs (avkit/provenance.py): the traces by sha256 of their bytes, the cost
model (a profiled table by its content), every setting; `avkit report` names a tune result made from other
traces, or one that records nothing."""

import hashlib
import json

import pytest
from conftest import write_trace_pair

from avkit.config import ReportConfig, SyntheticConfig, TuneConfig
from avkit.report import report_traces
from avkit.scheduling.cost import CostTable
from avkit.staged import write_json_atomic
from avkit.tune import tune

SMALL = SyntheticConfig(num_slots=7 * 8 * 16 * 2, k=7, trim_prob=0.0, batch_size=8, steps_per_request=16, seed=2)
FAST = TuneConfig(cost="roofline:H200:8b", concurrency=(1, 4), context=1024, bootstrap=20, max_k=2, seed=3)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return write_trace_pair(tmp_path_factory.mktemp("tune_prov"), SMALL, other_seed=4)


def test_tune_records_traces_cost_and_settings(traces, tmp_path):
    _, one, _ = traces
    rec = tune([one], FAST)["inputs"]
    assert rec["command"] == "avkit tune" and rec["avkit_version"] and rec["written"]
    assert rec["traces"] == [{"path": str(one), "sha256": hashlib.sha256(one.read_bytes()).hexdigest(),
                              "bytes": one.stat().st_size}]
    assert rec["cost"]["spec"] == "roofline:H200:8b" and rec["cost"]["source"] == "roofline"
    assert rec["args"]["concurrency"] == [1, 4] and rec["args"]["max_k"] == 2 and rec["args"]["seed"] == 3
    assert rec["args"]["bootstrap"] == 20 and rec["args"]["context"] == 1024
    # a profiled cost table is named by its content: another table under the same name is told apart
    cost = tmp_path / "cost.json"
    CostTable((1, 8), (10.0, 12.0), (1, 8), (2.0, 2.5), meta={"source": "profile", "device": "cpu"}).save(cost)
    first = tune([one], TuneConfig(**{**FAST.__dict__, "cost": str(cost)}))["inputs"]["cost"]
    assert first["sha256"] == hashlib.sha256(cost.read_bytes()).hexdigest()[:16] and first["spec"] == str(cost)
    CostTable((1, 8), (10.0, 13.0), (1, 8), (2.0, 2.5), meta={"source": "profile", "device": "cpu"}).save(cost)
    again = tune([one], TuneConfig(**{**FAST.__dict__, "cost": str(cost)}))["inputs"]["cost"]
    assert again["sha256"] != first["sha256"]


def test_report_names_a_tune_result_of_other_traces_or_without_a_record(traces):
    root, one, two = traces
    other = root / "tune_two.json"
    write_json_atomic(other, tune([two], FAST))
    warnings = []
    out = report_traces([one], root / "r1", ReportConfig(sim="/nonexistent/sim.parquet", hvd="/nonexistent/h.json",
                                                         tune=str(other), embed=False), warn=warnings.append)
    assert any("tuning results" in w and "two.parquet" in w and "other traces" in w for w in warnings), warnings
    section = (out / "index.html").read_text().split('<section id="tune">')[1].split("</section>")[0]
    assert "Inputs: avkit tune" in section and "two.parquet" in section
    old = json.loads(other.read_text())
    del old["inputs"]  # as written before tune recorded them
    write_json_atomic(root / "tune_old.json", old)
    warnings = []
    report_traces([one], root / "r2", ReportConfig(sim="/nonexistent/sim.parquet", hvd="/nonexistent/h.json",
                                                   tune=str(root / "tune_old.json"), embed=False),
                  warn=warnings.append)
    assert any("The tuning results" in w and "records no inputs" in w for w in warnings), warnings
