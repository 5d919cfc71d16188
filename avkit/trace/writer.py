"""Streaming Parquet writers for traces and generations (docs/traces.md, "Recording"): buffered rows become zstd
row groups; every flush rewrites `<path>.partial` whole (O(file), cheap next to the forwards that produce the
rows), `close` compacts the groups and renames it to `<path>`, and a resume starts from a previous file's rows.
"""

from __future__ import annotations

import os
import time
from contextlib import suppress
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from avkit.errors import TraceError, first_line
from avkit.staged import deferred_signals, staged_file
from avkit.trace import schema as S

COMPRESSION = "zstd"


def partial_path(path) -> Path:
    p = Path(path)
    return p.with_name(p.name + ".partial")


def resume_source(path) -> Path | None:
    """Where a resumed run starts: the partial file of an unfinished run, else the finished file."""
    p = Path(path)
    return partial_path(p) if partial_path(p).exists() else p if p.exists() else None


def _column_array(col: S.Column, values, n: int, path: Path) -> pa.Array:
    """One buffered column as an Arrow array of the schema's type (dictionary strings encoded here)."""
    if values is None:
        if not col.nullable:
            raise TraceError(f"{path}: required column {col.name!r} missing from written rows")
        return pa.nulls(n, type=col.type)
    if isinstance(values, np.ndarray) and values.dtype == object:
        values = values.tolist()
    try:
        if pa.types.is_dictionary(col.type):
            return pa.array(values, type=pa.string()).dictionary_encode().cast(col.type)
        return pa.array(values, type=col.type, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
        raise TraceError(f"{path}: column {col.name!r} cannot be written as {col.type}: {e}") from None


def row_groups(src: Path) -> list[pa.Table]:
    """The row groups of the file a resume starts from, or one TraceError naming it."""
    try:
        f = pq.ParquetFile(src)
        return [f.read_row_group(i) for i in range(f.num_row_groups)]
    except (OSError, pa.ArrowException) as e:
        raise TraceError(f"{src}: cannot resume from an unreadable file ({first_line(e)})") from None


class _ParquetStream:
    """Buffer column chunks, flush them as row groups of a Parquet file that is valid after each flush."""

    columns: tuple[S.Column, ...]  # the subclass's table: its columns,
    arrow: pa.Schema  # their Arrow schema (trace/schema.py)
    default_rows: int  # and its default row group size

    def __init__(self, path, metadata: dict[str, str], row_group_rows: int | None = None, resume: bool = False, *,
                 flush_interval_s: float | None = None, keep_requests=None, source: Path | None = None):
        self.path = Path(path)
        self.partial = partial_path(self.path)
        meta = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION, **metadata}
        self.schema = self.arrow.with_metadata({k: str(v) for k, v in meta.items()})
        self.row_group_rows = row_group_rows or self.default_rows
        self.flush_interval_s = flush_interval_s
        self._buffer: list[pa.Table] = []  # written, not yet a row group
        self._last_flush = time.monotonic()
        self.closed = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._groups: list[pa.Table] = self._existing(keep_requests, source) if resume else []
        self.rows_written = sum(g.num_rows for g in self._groups)
        if not resume and self.partial.exists():
            self.partial.unlink()

    def _existing(self, keep, source: Path | None) -> list[pa.Table]:
        """Row groups of a previous run (`source`, else the crashed partial, else the finished file)."""
        src = source if source is not None else resume_source(self.path)
        if src is None or not src.exists():
            return []
        groups = row_groups(src)
        have = set(groups[0].schema.names) if groups else set(pq.read_schema(src).names)
        missing = sorted(c.name for c in self.columns if c.name not in have and not c.nullable)
        if missing:
            raise TraceError(f"{src}: cannot resume, columns missing: {missing}")
        try:  # a nullable column newer than the file: null in its rows
            groups = [pa.table([g[c.name] if c.name in have else pa.nulls(g.num_rows, c.type) for c in self.columns],
                               names=[c.name for c in self.columns]).cast(self.arrow) for g in groups]
        except (pa.ArrowException, ValueError) as e:
            raise TraceError(f"{src}: cannot resume, columns do not cast to the schema ({e})") from None
        if keep is not None:
            keep_arr = pa.array(sorted(keep), type=pa.string())
            groups = [g.filter(pa.compute.is_in(g["request_id"].cast(pa.string()), keep_arr)) for g in groups]
        return [g for g in groups if g.num_rows]

    def table(self) -> pa.Table:
        """Every row written so far (resumed and flushed groups; not the unflushed buffer)."""
        if not self._groups:
            return self.arrow.empty_table()
        return pa.concat_tables(self._groups).unify_dictionaries()

    def next_engine_step(self) -> int:
        """The engine step after the last one written (0 when none): a resumed run continues the file's index."""
        return int(pa.compute.max(self.table()["engine_step"]).as_py()) + 1 if self.rows_written else 0

    def write(self, columns: dict) -> None:
        unknown = set(columns) - {c.name for c in self.columns}
        if unknown:
            raise TraceError(f"{self.path}: unknown columns {sorted(unknown)}")
        lengths = {k: len(v) for k, v in columns.items()}
        if len(set(lengths.values())) > 1:
            raise TraceError(f"{self.path}: columns of different lengths {lengths}")
        n = next(iter(lengths.values()), 0)
        if n == 0:
            return
        arrays = [_column_array(c, columns.get(c.name), n, self.path) for c in self.columns]
        self._buffer.append(pa.Table.from_arrays(arrays, schema=self.arrow))
        due = self.flush_interval_s is not None and time.monotonic() - self._last_flush >= self.flush_interval_s
        if sum(t.num_rows for t in self._buffer) >= self.row_group_rows or due:
            self.flush()

    def _seal_buffer(self) -> None:
        """Turn the buffered rows into one row group (in memory)."""
        self._last_flush = time.monotonic()
        if self._buffer:
            group = pa.concat_tables(self._buffer).unify_dictionaries().combine_chunks()
            self._groups.append(group)
            self.rows_written += group.num_rows
            self._buffer = []

    def flush(self) -> None:
        """Write buffered rows as a row group; afterwards `<path>.partial` is complete and readable."""
        with deferred_signals():
            self._seal_buffer()
            self._rewrite(self.partial)

    def _rewrite(self, dest: Path) -> None:
        with staged_file(dest, "--record", fsync=True) as tmp, \
                pq.ParquetWriter(tmp, self.schema, compression=COMPRESSION) as w:
            for g in self._groups:
                w.write_table(g.replace_schema_metadata(self.schema.metadata), row_group_size=g.num_rows)

    def close(self) -> None:
        """Flush, compact the time-based small row groups, then rename `<path>.partial` to `<path>`."""
        with deferred_signals():
            self._seal_buffer()
            self._compact()
            self._rewrite(self.partial)
            os.replace(self.partial, self.path)
        self.closed = True

    def _compact(self) -> None:
        """Merge consecutive row groups into groups of up to `row_group_rows` rows (row order kept)."""
        if len(self._groups) < 2:
            return
        merged = pa.concat_tables(self._groups).unify_dictionaries()
        step = max(1, min(self.row_group_rows, merged.num_rows))
        self._groups = [merged.slice(i, step).combine_chunks() for i in range(0, merged.num_rows, step)]

    def __enter__(self):
        return self

    def keep(self) -> None:
        """After an error: what was recorded stays in `<path>.partial` only; `<path>` is untouched."""
        if not self.closed:
            with suppress(Exception):  # the original error matters more than a failed last flush
                self.flush()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.keep()
        elif not self.closed:
            self.close()  # a normal exit commits `<path>`
        return False


class TraceWriter(_ParquetStream):
    """Write trace rows (schema v1) in zstd row groups; `<path>.partial` until closed."""

    columns, arrow, default_rows = S.COLUMNS, S.TRACE_SCHEMA, 65536


class GenerationWriter(_ParquetStream):
    """Write the generations table (one row per finished request) beside a trace."""

    columns, arrow, default_rows = S.GENERATION_COLUMNS, S.GENERATION_SCHEMA, 4096
