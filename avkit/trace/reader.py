"""Read trace files (format v1) and their generations tables, after checking them; every error is one line
naming the file (and the column).

  schema  (footer only: `check_schema`, `scan_traces`)  a Parquet file with a footer (truncated files have
          none), `avkit.schema_version` 1, every required column of the right type family (strings plain
          or dictionary; integer and float widths are cast to the schema's)
  values  (`read_traces`: read eagerly with pyarrow and validated before polars sees them, so damaged pages
          are a TraceError, never a decoder panic; rules in trace/values.py)
K of a file is its `avkit.k`, an integer in [0, MAX_K]; without it, max(num_drafted, position + 1), refused
above MAX_INFERRED_K. Files of different K are read at the largest (`common_k`, whose note the caller
prints). Optional columns absent from a file read as nulls; every frame gets `file_index` (UInt16).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from avkit.errors import TraceError, first_line
from avkit.trace import schema as S
from avkit.trace.values import MAX_INFERRED_K, SLOT_KEY, check_values, slot_hashes

# Canonical polars dtypes of every column (dictionary strings become Categorical).
POLARS_SCHEMA: dict[str, pl.DataType] = dict(pl.from_arrow(S.TRACE_SCHEMA.empty_table()).schema)
MAX_K = 1024  # largest K a file may declare in `avkit.k`
GENERATION_NEEDED = ("request_id", "dataset", "prompt_ids", "output_ids")  # what a replay reads
# Read in any case by `read_traces` (the checks need them), then projected away if not asked for.
CHECKED_COLUMNS = (*SLOT_KEY, "accepted", "verified", "num_drafted", "num_verified", "num_accepted")


def _family(t: pa.DataType) -> str:
    t = t.value_type if pa.types.is_dictionary(t) else t
    return ("string" if pa.types.is_string(t) or pa.types.is_large_string(t) else "bool" if pa.types.is_boolean(t)
            else "int" if pa.types.is_integer(t) else "float" if pa.types.is_floating(t) else str(t))


def _open(path: Path) -> pq.ParquetFile:
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    try:
        return pq.ParquetFile(path)
    except (OSError, pa.ArrowException, ValueError, TypeError) as e:
        raise TraceError(f"{path}: not a readable Parquet file (truncated or another format): "
                         f"{first_line(e)}") from None


def trace_metadata(path) -> dict[str, str]:
    """The file's key/value metadata (`avkit.*` keys, see `schema.META_KEYS`) as str -> str."""
    meta = _open(Path(path)).schema_arrow.metadata or {}
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in meta.items()
            if not k.startswith(b"ARROW:")}


def trace_k(path) -> int | None:
    """K declared by a file (`avkit.k`), checked to be an integer in [0, MAX_K]; None when absent."""
    text = trace_metadata(path).get("avkit.k")
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_K:
        raise TraceError(f"{path}: metadata avkit.k is {text!r}, expected an integer in [0, {MAX_K}]")
    return int(text)


def common_k(paths) -> tuple[int | None, str]:
    """(K of the files, note): the largest declared K, and a one-line note when the files differ."""
    ks = {Path(p): trace_k(p) for p in paths}
    declared = sorted({k for k in ks.values() if k is not None})
    if len(declared) <= 1:
        return (declared[0] if declared else None), ""
    per = ", ".join(f"{p.name} K={k}" for p, k in ks.items() if k is not None)
    return declared[-1], (f"traces of different K ({per}): read at K = {declared[-1]}; a step never verifies "
                          "more drafts than it recorded")


def _not_a_trace(names: list[str]) -> str:
    """What a Parquet file without the trace metadata probably is: the hint in its error."""
    if "output_ids" in names:
        return "a generations table: pass the trace beside it"
    if "policy" in names and "concurrency" in names:
        return "an `avkit simulate` output"
    return "did you pass a simulate output?"


def check_schema(path) -> pa.Schema:
    """Check one file's footer against trace format v1; return its Arrow schema."""
    path = Path(path)
    schema = _open(path).schema_arrow
    if S.META_SCHEMA_VERSION.encode() not in (schema.metadata or {}):
        raise TraceError(f"{path}: not an avkit trace ({_not_a_trace(schema.names)})")
    _check_footer(path, schema, S.COLUMNS, S.REQUIRED)
    return schema


def _check_footer(path: Path, schema: pa.Schema, columns: tuple[S.Column, ...], required) -> None:
    """The schema version (absent reads as v1: a generations table is plain Parquet anyone can write), every
    `required` column present, every column present of the schema's type family (a list: of integers)."""
    version = (schema.metadata or {}).get(S.META_SCHEMA_VERSION.encode(), b"1").decode(errors="replace")
    if version != S.SCHEMA_VERSION:
        raise TraceError(f"{path}: {S.META_SCHEMA_VERSION} is {version!r}, this avkit reads {S.SCHEMA_VERSION!r}")
    for col in columns:
        if col.name not in schema.names:
            if col.name in required:
                raise TraceError(f"{path}: required column {col.name!r} is missing")
            continue
        got = schema.field(col.name).type
        ok = (_family(got) == _family(col.type) if not pa.types.is_list(col.type) else
              (pa.types.is_list(got) or pa.types.is_large_list(got)) and _family(got.value_type) == "int")
        if not ok:
            raise TraceError(f"{path}: column {col.name!r} has type {got}, expected {col.type}")


def _schema_columns(names: set[str], columns: list[str], index: int) -> list[pl.Expr]:
    """`columns` cast to the schema's types, the ones not among a file's `names` as nulls, and its `file_index`."""
    return [*(pl.col(c).cast(POLARS_SCHEMA[c]) if c in names else pl.lit(None, dtype=POLARS_SCHEMA[c]).alias(c)
              for c in columns), pl.lit(index, dtype=pl.UInt16).alias("file_index")]


def _paths(paths) -> list[Path]:
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    if not paths:
        raise TraceError("no trace files given")
    return paths


def scan_traces(paths) -> pl.LazyFrame:
    """Schema-checked lazy scan of one or more trace files (rows in file order)."""
    every = [c.name for c in S.COLUMNS]
    return pl.concat([pl.scan_parquet(p).select(_schema_columns(set(check_schema(p).names), every, i))
                      for i, p in enumerate(_paths(paths))], how="vertical")


def _read_arrow(path: Path, columns: list[str], then=lambda df: df) -> pl.DataFrame:
    """Columns of a Parquet file read eagerly with pyarrow and validated (a damaged page or invalid UTF-8
    raises a clean error, never a decoder panic), as polars, passed through `then`; TraceError on failure."""
    try:
        table = pq.read_table(path, columns=columns)
        table = pa.Table.from_arrays(table.columns, names=table.column_names)  # no (possibly non-UTF-8) metadata
        table.validate(full=True)
        return then(pl.from_arrow(table))
    except (pl.exceptions.PolarsError, OSError, pa.ArrowException, ValueError, TypeError) as e:
        raise TraceError(f"{path}: cannot read rows: {first_line(e)}") from None
    except pl.exceptions.PanicException as e:  # last resort: a decoder bug on damaged input
        raise TraceError(f"{path}: cannot read rows (damaged data): {first_line(e)}") from None


def _read_one(path: Path, index: int, cols: list[str]) -> pl.DataFrame:
    """One file's `cols` (schema-checked; absent optional columns as nulls, types cast to the schema's)."""
    names = set(check_schema(path).names)
    return _read_arrow(path, [c for c in cols if c in names], lambda df: df.select(_schema_columns(names, cols, index)))


def no_repeats(paths: list[Path]) -> None:
    """Refuse a file given twice (by device and inode: under two names too)."""
    seen: dict[tuple[int, int], Path] = {}
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            continue  # reported as missing by the reader
        key = (st.st_dev, st.st_ino)
        if key in seen:
            raise TraceError(f"{p}: given twice (also as {seen[key]}); its rows would be counted twice")
        seen[key] = p


def read_traces(paths, columns: list[str] | None = None) -> pl.DataFrame:
    """Trace files in one frame with `file_index`, the schema and the values of the columns read checked;
    `columns` projects the read (the checked columns are read in any case)."""
    frames = list(iter_traces(paths, columns))
    return pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]


def iter_traces(paths, columns: list[str] | None = None):
    """`read_traces` one file at a time (a caller reduces a file before the next is read)."""
    paths = _paths(paths)
    no_repeats(paths)
    want = None if columns is None else {*columns, *CHECKED_COLUMNS}
    cols = [c.name for c in S.COLUMNS if want is None or c.name in want]
    for i, path in enumerate(paths):
        df = _read_one(path, i, cols)
        check_values(df, path, trace_k(path))
        yield df if columns is None else df.select([*columns, "file_index"])


def read_generations(trace_path) -> pl.DataFrame:
    """The generations table beside a trace, checked: readable, not another schema version, the columns a
    replay reads (GENERATION_NEEDED) present with their types, no nulls, one row per request_id.
    Returns those columns; request_id and dataset as plain strings, token ids as Int64 lists."""
    trace_path = Path(trace_path)
    path = S.generations_path(trace_path)
    if not path.is_file():
        check_schema(trace_path)  # a file that is no trace at all says so first
        raise TraceError(f"{trace_path}: no generations table beside it (expected {path})")
    _check_footer(path, _open(path).schema_arrow, S.GENERATION_COLUMNS, GENERATION_NEEDED)
    df = _read_arrow(path, list(GENERATION_NEEDED), lambda df: df.with_columns(
        pl.col("request_id", "dataset").cast(pl.String), pl.col("prompt_ids", "output_ids").cast(pl.List(pl.Int64))))
    for c in df.columns:  # a null, or a null inside a token list
        bad = df[c].is_null() | (df[c].list.eval(pl.element().is_null()).list.any() if df[c].dtype == pl.List
                                 else False)
        if bad.any():
            raise TraceError(f"{path}: column {c!r} holds nulls (first at row {int(bad.arg_true()[0])})")
    dup = df["request_id"].is_duplicated()
    if dup.any():
        i = int(dup.arg_true()[0])
        raise TraceError(f"{path}: row {i} repeats request_id {df['request_id'][i]!r}; it would be counted twice")
    return df


__all__ = ["MAX_INFERRED_K", "MAX_K", "POLARS_SCHEMA", "check_schema", "check_values", "common_k", "iter_traces",
           "no_repeats", "read_generations", "read_traces", "scan_traces", "slot_hashes", "trace_k", "trace_metadata"]
