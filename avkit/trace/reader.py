"""Read trace files (format v1) lazily with polars, after checking them against the schema.

Two layers of checks, each naming the file and the column:
  schema  (footer only, cheap; `scan_traces`)  the file exists and is Parquet with a footer
          (truncated files have none), `avkit.schema_version` is 1, every required column is
          present with the right type family (string columns may be plain or dictionary
          strings; integer and float widths may differ and are cast to the schema's)
  values  (`read_traces`)  features finite, probabilities in [0, 1], positions in [0, K),
          labels only on verified slots
Optional columns (engine_step, accept_prob, ...) absent from a file read as nulls. Every frame
gets a `file_index` column (UInt16: index of the file in `paths`) so replays can keep runs apart.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from avkit.errors import TraceError
from avkit.trace import schema as S

# Canonical polars dtypes of every column (dictionary strings become Categorical).
POLARS_SCHEMA: dict[str, pl.DataType] = dict(pl.from_arrow(S.TRACE_SCHEMA.empty_table()).schema)
FINITE_COLUMNS = ("q_max", "q_2nd", "q_sampled", "entropy", "logit_qmax")
PROBABILITY_COLUMNS = ("q_max", "q_2nd", "q_sampled", "target_prob", "accept_prob", "confidence", "head_conf")


def _family(t: pa.DataType) -> str:
    if pa.types.is_dictionary(t):
        return _family(t.value_type)
    for name, test in (("string", pa.types.is_string), ("string", pa.types.is_large_string),
                       ("bool", pa.types.is_boolean), ("int", pa.types.is_integer),
                       ("float", pa.types.is_floating)):
        if test(t):
            return name
    return str(t)


def _open(path: Path) -> pq.ParquetFile:
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    try:
        return pq.ParquetFile(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise TraceError(f"{path}: not a readable Parquet file (truncated or another format): {e}") from None


def trace_metadata(path) -> dict[str, str]:
    """The file's key/value metadata (`avkit.*` keys, see `schema.META_KEYS`) as str -> str."""
    meta = _open(Path(path)).schema_arrow.metadata or {}
    return {k.decode(): v.decode() for k, v in meta.items() if not k.startswith(b"ARROW:")}


def check_schema(path) -> pa.Schema:
    """Check one file's footer against trace format v1; return its Arrow schema."""
    path = Path(path)
    schema = _open(path).schema_arrow
    meta = schema.metadata or {}
    version = meta.get(S.META_SCHEMA_VERSION.encode(), b"<missing>").decode()
    if version != S.SCHEMA_VERSION:
        raise TraceError(f"{path}: {S.META_SCHEMA_VERSION} is {version!r}, this avkit reads {S.SCHEMA_VERSION!r}")
    for col in S.COLUMNS:
        if col.name not in schema.names:
            if col.name in S.REQUIRED:
                raise TraceError(f"{path}: required column {col.name!r} is missing")
            continue
        got, want = schema.field(col.name).type, col.type
        if _family(got) != _family(want):
            raise TraceError(f"{path}: column {col.name!r} has type {got}, expected {want}")
    return schema


def _scan_one(path: Path, index: int) -> pl.LazyFrame:
    names = set(check_schema(path).names)
    exprs = [pl.col(c.name).cast(POLARS_SCHEMA[c.name]) if c.name in names
             else pl.lit(None, dtype=POLARS_SCHEMA[c.name]).alias(c.name) for c in S.COLUMNS]
    return pl.scan_parquet(path).select(*exprs, pl.lit(index, dtype=pl.UInt16).alias("file_index"))


def scan_traces(paths) -> pl.LazyFrame:
    """Schema-checked lazy scan of one or more trace files (rows in file order).

    Examples
    --------
    >>> import tempfile
    >>> from avkit.config import SyntheticConfig
    >>> from avkit.trace.synthetic import write_synthetic_trace
    >>> p = write_synthetic_trace(tempfile.mkdtemp() + "/t.parquet", SyntheticConfig(num_slots=14, k=7))
    >>> scan_traces([p]).select(pl.len()).collect().item()
    14
    """
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    if not paths:
        raise TraceError("no trace files given")
    return pl.concat([_scan_one(p, i) for i, p in enumerate(paths)], how="vertical")


def _first_bad(df: pl.DataFrame, bad: pl.Expr, column: str) -> str:
    row = df.with_row_index("_row").filter(bad).select("_row", column).row(0)
    return f"row {row[0]} has {column} = {row[1]}"


def check_values(df: pl.DataFrame, path, k: int | None) -> None:
    """Value checks of the columns read from one file; raise TraceError naming file, column, row."""
    checks: list[tuple[str, pl.Expr, str]] = []
    for c in FINITE_COLUMNS:
        checks.append((c, ~pl.col(c).is_finite(), "is not finite"))
    for c in PROBABILITY_COLUMNS:
        checks.append((c, (pl.col(c) < 0) | (pl.col(c) > 1), "is outside [0, 1]"))
    checks.append(("position", pl.col("position") < 0, "is negative"))
    if k is not None:
        checks.append(("position", pl.col("position") >= k, f"is >= K = {k}"))
    checks.append(("accepted", pl.col("accepted").is_not_null() & ~pl.col("verified"),
                   "is set on an unverified slot"))
    checks = [ch for ch in checks if set(ch[1].meta.root_names()) <= set(df.columns)]  # what was read
    hits = df.select(e.fill_null(False).any().alias(str(i)) for i, (_, e, _) in enumerate(checks)).row(0)
    for (column, bad, what), hit in zip(checks, hits):
        if hit:
            raise TraceError(f"{path}: column {column!r} {what}: {_first_bad(df, bad.fill_null(False), column)}")


def read_traces(paths, columns: list[str] | None = None, *, check: bool = True) -> pl.DataFrame:
    """Read trace files into one frame, checking the schema and (by default) every value.

    `columns` projects the read (position, accepted and verified are read in any case); the value
    checks cover the columns read. `file_index` is added.
    """
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    if not paths:
        raise TraceError("no trace files given")
    frames = []
    for i, path in enumerate(paths):
        lf = _scan_one(path, i)
        want = None if columns is None else list(dict.fromkeys(
            [*columns, "position", "accepted", "verified", "file_index"]))
        try:
            df = (lf if want is None else lf.select(want)).collect()
        except (pl.exceptions.PolarsError, OSError) as e:
            raise TraceError(f"{path}: cannot read rows: {str(e).splitlines()[0]}") from None
        if check:
            k = trace_metadata(path).get("avkit.k")
            check_values(df, path, int(k) if k and k.isdigit() else None)
        frames.append(df if columns is None else df.select([*columns, "file_index"]))
    return pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]


__all__ = ["POLARS_SCHEMA", "check_schema", "check_values", "read_traces", "scan_traces", "trace_metadata"]
