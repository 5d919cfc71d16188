"""Trace reader: round trips with the writer and the synthetic generator, and one clear error per
kind of bad file, naming the file and the column."""

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from avkit.config import SyntheticConfig
from avkit.errors import TraceError
from avkit.trace.reader import POLARS_SCHEMA, read_traces, scan_traces, trace_metadata
from avkit.trace.synthetic import synthetic_trace
from avkit.trace.writer import TraceWriter


@pytest.fixture(scope="module")
def table():
    return synthetic_trace(SyntheticConfig(num_slots=700, k=7, seed=1))


def _write(tmp_path, table, name="t.parquet"):
    path = tmp_path / name
    pq.write_table(table, path)
    return path


def test_round_trip_synthetic(tmp_path, table):
    path = _write(tmp_path, table)
    df = read_traces([path])
    assert df.height == 700
    assert dict(df.schema) == POLARS_SCHEMA | {"file_index": pl.UInt16}
    assert trace_metadata(path)["avkit.k"] == "7"
    np.testing.assert_array_equal(df["logit_qmax"].to_numpy(), table["logit_qmax"].to_numpy())


def test_round_trip_trace_writer(tmp_path):
    row = {"run_id": ["r"], "dataset": ["d"], "request_id": ["a"], "drafter": ["model"], "step": [0],
           "position": [1], "draft_token": [5], "q_max": [0.9], "q_2nd": [0.05], "q_sampled": [0.9],
           "entropy": [0.3], "logit_qmax": [2.2], "target_prob": [0.8], "verified": [True], "accepted": [True],
           "num_drafted": [2], "num_verified": [2], "num_accepted": [2], "batch_size": [1],
           "step_time_ms": [3.0], "temperature": [1.0], "top_p": [0.95], "engine_step": [0]}
    with TraceWriter(tmp_path / "w.parquet", {"avkit.k": "2"}) as w:
        w.write(row)
    df = read_traces([tmp_path / "w.parquet"])
    assert df.height == 1 and df["position"].item() == 1 and df["accepted"].item() is True


def test_multiple_files_and_projection(tmp_path, table):
    paths = [_write(tmp_path, table, "a.parquet"), _write(tmp_path, table.slice(0, 70), "b.parquet")]
    df = read_traces(paths, ["logit_qmax", "engine_step"])
    assert df.columns == ["logit_qmax", "engine_step", "file_index"]
    assert df["file_index"].to_list() == [0] * 700 + [1] * 70
    assert scan_traces(paths).select(pl.len()).collect().item() == 770


def test_optional_columns_absent_read_as_null_and_plain_types_are_cast(tmp_path, table):
    t = table.drop_columns(["engine_step", "head_conf", "accept_prob"])
    t = t.set_column(t.schema.get_field_index("dataset"), "dataset", t["dataset"].cast(pa.string()))
    t = t.set_column(t.schema.get_field_index("position"), "position", t["position"].cast(pa.int64()))
    df = read_traces([_write(tmp_path, t)])
    assert df["engine_step"].null_count() == 700 and df.schema["position"] == pl.Int16
    assert df.schema["dataset"] == POLARS_SCHEMA["dataset"]


def _set(t: pa.Table, name: str, values) -> pa.Table:
    return t.set_column(t.schema.get_field_index(name), name, values)


def _nan_at(t, name, i=5):
    v = t[name].to_numpy().copy()
    v[i] = np.nan
    return _set(t, name, pa.array(v, t.schema.field(name).type))


BAD_TABLES = {
    "wrong version": (lambda t: t.replace_schema_metadata({**t.schema.metadata, b"avkit.schema_version": b"2"}),
                      "avkit.schema_version is '2'"),
    "missing column": (lambda t: t.drop_columns(["q_max"]), "required column 'q_max' is missing"),
    "mistyped column": (lambda t: _set(t, "step", t["step"].cast(pa.string())), "column 'step' has type string"),
    "nan feature": (lambda t: _nan_at(t, "logit_qmax"), "column 'logit_qmax' is not finite: row 5"),
    "inf feature": (lambda t: _set(t, "entropy", pc.add(t["entropy"], pa.scalar(np.inf, pa.float32()))),
                    "column 'entropy' is not finite"),
    "probability > 1": (lambda t: _set(t, "q_sampled", pc.multiply(t["q_sampled"], pa.scalar(3.0, pa.float32()))),
                        "column 'q_sampled' is outside [0, 1]"),
    "position >= K": (lambda t: _set(t, "position", pc.add(t["position"], pa.scalar(1, pa.int16()))),
                      "column 'position' is >= K = 7"),
    "label on unverified slot": (lambda t: _set(t, "verified", pa.array(np.zeros(t.num_rows, bool))),
                                 "column 'accepted' is set on an unverified slot"),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_bad_table_names_file_and_column(tmp_path, table, case):
    corrupt, message = BAD_TABLES[case]
    path = _write(tmp_path, corrupt(table))
    with pytest.raises(TraceError) as err:
        read_traces([path])
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_files(tmp_path, table):
    with pytest.raises(TraceError, match="no such trace file"):
        read_traces([tmp_path / "missing.parquet"])
    (tmp_path / "x.parquet").write_text("run_id,dataset\n")
    with pytest.raises(TraceError, match="not a readable Parquet file"):
        scan_traces([tmp_path / "x.parquet"])
    good = _write(tmp_path, table).read_bytes()
    (tmp_path / "cut.parquet").write_bytes(good[: len(good) // 2])
    with pytest.raises(TraceError, match="cut.parquet: not a readable Parquet file"):
        read_traces([tmp_path / "cut.parquet"])
    with pytest.raises(TraceError, match="no trace files"):
        read_traces([])

