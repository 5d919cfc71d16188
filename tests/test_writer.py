"""TraceWriter / GenerationWriter: row groups, temp + rename, readable after a crash, resume."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from avkit.errors import TraceError
from avkit.trace import schema as S
from avkit.trace.writer import GenerationWriter, TraceWriter, partial_path

META = {"avkit.k": "3", "avkit.target": "tiny"}


def rows(request_id: str, steps: int = 2, k: int = 3, accepted_len: int = 1) -> dict:
    """Trace rows of one request: `steps` steps of k slots; the first `accepted_len` accepted."""
    n = steps * k
    pos = np.tile(np.arange(k), steps)
    accepted = np.ma.masked_array(pos < accepted_len, mask=pos > accepted_len)  # censored after rejection
    return {
        "run_id": np.full(n, "run0", dtype=object), "dataset": np.full(n, "ds", dtype=object),
        "request_id": np.full(n, request_id, dtype=object), "drafter": np.full(n, "model", dtype=object),
        "step": np.repeat(np.arange(steps), k), "position": pos, "draft_token": np.arange(n),
        "q_max": np.full(n, 0.9), "q_2nd": np.full(n, 0.05), "q_sampled": np.full(n, 0.9),
        "entropy": np.full(n, 0.4), "logit_qmax": np.full(n, 2.2),
        "target_prob": np.ma.masked_array(np.full(n, 0.7), mask=np.zeros(n, bool)),
        "verified": np.ones(n, bool), "accepted": accepted,
        "num_drafted": np.full(n, k), "num_verified": np.full(n, k), "num_accepted": np.full(n, accepted_len),
        "batch_size": np.ones(n), "step_time_ms": np.full(n, 5.0), "temperature": np.ones(n),
        "top_p": np.full(n, 0.95), "engine_step": np.repeat(np.arange(steps), k),
    }


def test_round_trip_schema_metadata_and_nulls(tmp_path):
    path = tmp_path / "t.parquet"
    with TraceWriter(path, META, row_group_rows=6) as w:
        w.write(rows("a"))
        w.write(rows("b"))
        assert not path.exists()  # only the partial file while writing
    f = pq.ParquetFile(path)
    assert f.num_row_groups == 2 and f.metadata.num_rows == 12
    assert f.schema_arrow.remove_metadata().equals(S.TRACE_SCHEMA)
    meta = {k.decode(): v.decode() for k, v in f.schema_arrow.metadata.items() if k.startswith(b"avkit")}
    assert meta == {**META, S.META_SCHEMA_VERSION: S.SCHEMA_VERSION}
    t = f.read()
    assert t["accepted"].null_count == 4  # position 2 of each of 4 steps censored (accepted_len = 1)
    assert t["confidence"].null_count == 12  # optional column absent from the rows -> nulls
    assert t["request_id"].cast(pa.string()).to_pylist() == ["a"] * 6 + ["b"] * 6
    assert f.metadata.row_group(0).column(0).compression == "ZSTD"
    assert not partial_path(path).exists()


def test_partial_file_readable_after_each_flush_and_after_a_crash(tmp_path):
    path = tmp_path / "t.parquet"
    w = TraceWriter(path, META, row_group_rows=6)
    w.write(rows("a"))  # 6 rows: flushed
    assert pq.read_table(partial_path(path)).num_rows == 6
    w.write(rows("b", steps=1))  # 3 rows: still buffered
    assert pq.read_table(partial_path(path)).num_rows == 6
    del w  # a crash: never closed
    assert not path.exists()
    t = pq.read_table(partial_path(path))
    assert t.num_rows == 6 and set(t["request_id"].cast(pa.string()).to_pylist()) == {"a"}


def test_exception_inside_with_keeps_rows_in_the_partial_and_the_final_untouched(tmp_path):
    path = tmp_path / "t.parquet"
    with TraceWriter(path, META) as w:
        w.write(rows("old"))
    before = path.read_bytes()
    with pytest.raises(KeyboardInterrupt), TraceWriter(path, META) as w:
        w.write(rows("a"))
        raise KeyboardInterrupt
    assert pq.read_table(partial_path(path)).num_rows == 6  # what was recorded is kept...
    assert path.read_bytes() == before  # ...but a run that failed never replaces the final file


def test_flush_interval_makes_rows_durable_and_close_compacts(tmp_path):
    path = tmp_path / "t.parquet"
    w = TraceWriter(path, META, row_group_rows=15, flush_interval_s=1e-9)
    for rid in "abcd":
        w.write(rows(rid))  # each write flushed: 4 groups of 6 rows
    assert pq.ParquetFile(partial_path(path)).num_row_groups == 4
    w.close()
    f = pq.ParquetFile(path)
    assert [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)] == [15, 9]
    assert f.read()["request_id"].cast(pa.string()).to_pylist() == [r for r in "abcd" for _ in range(6)]


def test_resume_appends_and_keeps_only_requested_ids(tmp_path):
    path = tmp_path / "t.parquet"
    with TraceWriter(path, META) as w:
        w.write(rows("a"))
        w.write(rows("b"))
    with TraceWriter(path, META, resume=True, keep_requests={"a"}) as w:
        assert w.rows_written == 6 and set(w.table()["request_id"].cast(pa.string()).to_pylist()) == {"a"}
        w.write(rows("b"))
        w.write(rows("c"))
    t = pq.read_table(path)
    keys = list(zip(t["request_id"].cast(pa.string()).to_pylist(), t["step"].to_pylist(), t["position"].to_pylist()))
    assert len(keys) == 18 and len(set(keys)) == 18


def test_resume_prefers_a_crashed_partial(tmp_path):
    path = tmp_path / "t.parquet"
    w = TraceWriter(path, META, row_group_rows=1)
    w.write(rows("a"))
    del w
    with TraceWriter(path, META, resume=True) as w:
        assert set(w.table()["request_id"].cast(pa.string()).to_pylist()) == {"a"}
        w.write(rows("b"))
    assert pq.read_table(path).num_rows == 12


def test_not_resuming_never_clobbers_until_close(tmp_path):
    path = tmp_path / "t.parquet"
    with TraceWriter(path, META) as w:
        w.write(rows("old"))
    w = TraceWriter(path, META, row_group_rows=1)
    w.write(rows("new"))
    assert set(pq.read_table(path)["request_id"].cast(pa.string()).to_pylist()) == {"old"}
    w.close()
    assert set(pq.read_table(path)["request_id"].cast(pa.string()).to_pylist()) == {"new"}


def test_bad_rows_name_the_column(tmp_path):
    path = tmp_path / "t.parquet"
    w = TraceWriter(path, META)
    bad = rows("a")
    del bad["q_max"]
    with pytest.raises(TraceError, match="required column 'q_max'"):
        w.write(bad)
    with pytest.raises(TraceError, match=r"unknown columns \['bogus'\]"):
        w.write({**rows("a"), "bogus": np.zeros(6)})
    with pytest.raises(TraceError, match="different lengths"):
        w.write({**rows("a"), "q_max": np.zeros(5)})
    with pytest.raises(TraceError, match="'step' cannot be written"):
        w.write({**rows("a"), "step": np.full(6, "x", dtype=object)})


def test_resume_from_unreadable_file(tmp_path):
    path = tmp_path / "t.parquet"
    path.write_bytes(b"not parquet")
    with pytest.raises(TraceError, match="cannot resume"):
        TraceWriter(path, META, resume=True)


def test_generation_writer_round_trip(tmp_path):
    path = tmp_path / "t.generations.parquet"
    with GenerationWriter(path, META) as g:
        g.write({"run_id": ["r", "r"], "request_id": ["a", "b"], "dataset": ["ds", "ds"],
                 "prompt_ids": [[1, 2, 3], [4]], "output_ids": [[5, 6], []], "finish_reason": ["stop", "length"]})
    t = pq.read_table(path)
    assert t.schema.remove_metadata().equals(S.GENERATION_SCHEMA)
    assert t["prompt_ids"].to_pylist() == [[1, 2, 3], [4]] and t["output_ids"].to_pylist() == [[5, 6], []]
