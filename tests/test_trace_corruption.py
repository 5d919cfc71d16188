"""Property: any corruption of a valid trace file -> one AvkitError or a valid read, never another exception.

Corruptions (hypothesis draws the kind and its parameters): bytes (overwrite, truncate, append),
schema (drop, retype or rename a column), metadata (avkit.k, schema version, none at all) and
values (one cell set to NaN, inf, a negative, a huge integer, null). Each corrupted file goes
through everything that reads traces: `read_traces`, `common_k`, the simulator's `load_steps`
and, with a generations table beside it, the hybrid-drafting reader. A read that succeeds must
still satisfy the contract the reader promises (positions in [0, K), K <= MAX_K).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from avkit.config import SyntheticConfig
from avkit.errors import AvkitError
from avkit.hvd.replay import load_generations
from avkit.sim.replay import load_steps
from avkit.trace import schema as S
from avkit.trace.reader import MAX_INFERRED_K, common_k, read_generations, read_traces
from avkit.trace.synthetic import write_synthetic_trace

K = 3
BAD_VALUES = (float("nan"), float("inf"), -1, -1.5, 0, 2, 40000, 2**40, None)


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    root = tmp_path_factory.mktemp("valid")
    path = write_synthetic_trace(root / "t.parquet", SyntheticConfig(num_slots=240, k=K, intercepts=(1.0, 0.5, 0.2)))
    table = pq.read_table(path)
    ids = sorted(set(table["request_id"].cast(pa.string()).to_pylist()))
    gens = pa.table({"run_id": ["synthetic"] * len(ids), "request_id": ids, "dataset": ["code"] * len(ids),
                     "prompt_ids": [[1, 2, 3]] * len(ids), "output_ids": [[4, 5, 6, 7, 8, 9]] * len(ids),
                     "finish_reason": ["stop"] * len(ids)})
    return path.read_bytes(), table, gens


def _bytes(data: bytes, draw) -> bytes:
    b = bytearray(data)
    kind = draw(st.sampled_from(["overwrite", "truncate", "append"]))
    if kind == "overwrite":
        for _ in range(draw(st.integers(1, 8))):
            b[draw(st.integers(0, len(b) - 1))] = draw(st.integers(0, 255))
    elif kind == "truncate":
        b = b[:draw(st.integers(0, len(b) - 1))]
    else:
        b += draw(st.binary(min_size=1, max_size=64))
    return bytes(b)


def _schema(table: pa.Table, draw) -> pa.Table:
    name = draw(st.sampled_from(table.column_names))
    kind = draw(st.sampled_from(["drop", "retype", "rename"]))
    i = table.column_names.index(name)
    if kind == "drop":
        return table.drop_columns([name])
    if kind == "rename":
        return table.rename_columns([n if n != name else name + "_x" for n in table.column_names])
    to = draw(st.sampled_from([pa.float64(), pa.int64(), pa.int8(), pa.string(), pa.bool_()]))
    col = table[name]
    col = col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col
    try:
        new = col.cast(to, safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # e.g. a list column: store its text instead
        new = pa.array([None if v is None else str(v) for v in col.to_pylist()], type=pa.string())
    return table.set_column(i, pa.field(name, new.type), new)


def _metadata(table: pa.Table, draw) -> pa.Table:
    meta = dict(table.schema.metadata or {})
    key = draw(st.sampled_from([b"avkit.k", b"avkit.schema_version", b"all"]))
    if key == b"all":
        return table.replace_schema_metadata(None)
    text = draw(st.one_of(st.sampled_from(["", "7.5", "-1", "0", "2", "99999", "2", "k", "1e3", "\u0663"]),
                          st.text(max_size=6)))
    meta[key] = text.encode("utf-8", "surrogatepass")
    return table.replace_schema_metadata(meta)


def _values(table: pa.Table, draw) -> pa.Table:
    name = draw(st.sampled_from(table.column_names))
    row = draw(st.integers(0, table.num_rows - 1))
    value = draw(st.sampled_from(BAD_VALUES))
    col = table[name].combine_chunks()
    values = col.cast(pa.string()).to_pylist() if pa.types.is_dictionary(col.type) else col.to_pylist()
    values[row] = value if not isinstance(values[row], str) or value is None else str(value)
    try:
        new = pa.array(values, type=pa.string() if pa.types.is_dictionary(col.type) else col.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        new = pa.array([None if v is None else str(v) for v in values], type=pa.string())
    return table.set_column(table.column_names.index(name), pa.field(name, new.type), new)


def _duplicate(table: pa.Table, draw) -> pa.Table:
    row = draw(st.integers(0, table.num_rows - 1))
    return pa.concat_tables([table, table.slice(row, 1)]).combine_chunks()


@st.composite
def corrupted(draw, valid):
    data, table, _ = valid
    kind = draw(st.sampled_from(["bytes", "schema", "metadata", "values", "duplicate", "empty"]))
    if kind == "bytes":
        return kind, _bytes(data, draw)
    if kind == "empty":
        return kind, table.slice(0, 0)
    change = {"schema": _schema, "metadata": _metadata, "values": _values, "duplicate": _duplicate}[kind]
    return kind, change(table, draw)


def _write(path, corrupt) -> None:
    if isinstance(corrupt, bytes):
        path.write_bytes(corrupt)
    else:
        pq.write_table(corrupt, path)


def _read_everything(path) -> None:
    df = read_traces([path])
    k, _ = common_k([path])
    steps = load_steps([path])
    # what a successful read promises
    assert df.height > 0 and df["position"].min() >= 0
    if k is not None:
        assert df["position"].max() < k and steps.k == k
    else:
        assert steps.k <= MAX_INFERRED_K
    assert steps.label.shape[1] == steps.k


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_corruption_is_one_avkit_error_or_a_valid_read(valid, tmp_path, data):
    kind, corrupt = data.draw(corrupted(valid))
    path = tmp_path / "c.parquet"
    _write(path, corrupt)
    try:
        _read_everything(path)
    except AvkitError as e:
        assert "\n" not in str(e) and str(path) in str(e), (kind, str(e))


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_corruption_of_the_generations_table_is_one_avkit_error_or_a_read(valid, tmp_path, data):
    raw, _, gens = valid
    (tmp_path / "t.parquet").write_bytes(raw)
    g = S.generations_path(tmp_path / "t.parquet")
    buf = pa.BufferOutputStream()
    pq.write_table(gens, buf)
    kind = data.draw(st.sampled_from(["bytes", "schema", "values", "duplicate"]))
    corrupt = (_bytes(buf.getvalue().to_pybytes(), data.draw) if kind == "bytes" else
               {"schema": _schema, "values": _values, "duplicate": _duplicate}[kind](gens, data.draw))
    _write(g, corrupt)
    try:
        df = read_generations(tmp_path / "t.parquet")
        load_generations([tmp_path / "t.parquet"])
        assert df["request_id"].n_unique() == df.height
    except AvkitError as e:
        assert "\n" not in str(e), (kind, str(e))


def test_the_valid_file_reads(valid, tmp_path):
    """The base of the corruptions is itself valid (otherwise the property would be vacuous)."""
    path = tmp_path / "t.parquet"
    path.write_bytes(valid[0])
    _read_everything(path)
    assert pc.max(valid[1]["position"]).as_py() == K - 1
