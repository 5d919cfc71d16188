"""The values layer of the trace checks: every rule a trace's rows must keep, as polars expressions.

Rules (`check_values`, on the columns read from one file; each error names the file, the column
and the first bad row): no nulls in non-null columns; features finite, probabilities in [0, 1];
positions in [0, K) and below num_drafted; 0 <= num_accepted <= num_verified <= num_drafted <=
K; step_time_ms finite and >= 0; batch_size >= 1; labels only on verified slots; no two rows for
one slot (SLOT_KEY: run_id, request_id, drafter, step, position); at least one row per file. K is
the file's `avkit.k`; without one, K above MAX_INFERRED_K is refused (one corrupt integer must
not size arrays).
"""

from __future__ import annotations

import polars as pl

from avkit.errors import TraceError
from avkit.trace import schema as S

FINITE_COLUMNS = ("q_max", "q_2nd", "q_sampled", "entropy", "logit_qmax", "step_time_ms", "temperature")
PROBABILITY_COLUMNS = ("q_max", "q_2nd", "q_sampled", "target_prob", "accept_prob", "confidence", "head_conf")
MAX_INFERRED_K = 64  # largest K inferred from the rows of a file without `avkit.k`
SLOT_KEY = ("run_id", "request_id", "drafter", "step", "position")  # one row per draft slot


def _first_bad(df: pl.DataFrame, bad: pl.Expr, column: str, first_row: int = 0) -> str:
    row = df.with_row_index("_row").filter(bad).select("_row", column).row(0)
    return f"row {row[0] + first_row} has {column} = {row[1]}"


def _value_checks(k: int | None) -> list[tuple[str, pl.Expr, str]]:
    """(column, bad-row expression, what is wrong) for every rule of the module docstring."""
    c = pl.col
    checks: list[tuple[str, pl.Expr, str]] = [
        (col.name, c(col.name).is_null(), "is null (a required, non-null column)")
        for col in S.COLUMNS if not col.nullable and col.name in S.REQUIRED]
    checks += [(n, ~c(n).is_finite(), "is not finite") for n in FINITE_COLUMNS]
    checks += [(n, (c(n) < 0) | (c(n) > 1), "is outside [0, 1]") for n in PROBABILITY_COLUMNS]
    checks += [
        ("step_time_ms", c("step_time_ms") < 0, "is negative"),
        ("temperature", c("temperature") < 0, "is negative"),
        ("top_p", (c("top_p") <= 0) | (c("top_p") > 1) | c("top_p").is_nan(), "is outside (0, 1]"),
        ("batch_size", c("batch_size") < 1, "is below 1"),
        ("step", c("step") < 0, "is negative"),
        ("position", c("position") < 0, "is negative"),
    ]
    limit, why = ((k, f"K = {k} (avkit.k)") if k is not None else
                  (MAX_INFERRED_K, f"{MAX_INFERRED_K} in a file without avkit.k metadata (K above {MAX_INFERRED_K} "
                                   "is refused)"))
    checks += [("position", c("position") >= limit, f"is >= {why}"),
               ("num_drafted", c("num_drafted") > limit, f"is > {why}")]
    checks += [
        ("num_verified", (c("num_verified") < 0) | (c("num_verified") > c("num_drafted")),
         "is outside [0, num_drafted]"),
        ("num_accepted", (c("num_accepted") < 0) | (c("num_accepted") > c("num_verified")),
         "is outside [0, num_verified]"),
        ("position", c("position") >= c("num_drafted"), "is >= num_drafted of its row"),
        ("accepted", c("accepted").is_not_null() & ~c("verified"), "is set on an unverified slot"),
    ]
    return checks


def slot_hashes(df: pl.DataFrame, across_frames: bool = False) -> pl.Series:
    """[N] uint64 hash of each row's slot key (SLOT_KEY): equal slots hash equal within one frame
    (Categorical columns hash their codes, which one frame shares) or, `across_frames`, in any frame
    (Categorical columns hash their strings: the chunks of one shard agree)."""
    cat = (lambda c: pl.col(c).cast(pl.String)) if across_frames else (lambda c: pl.col(c).to_physical())
    return df.select(cat(c) if df.schema[c] == pl.Categorical else pl.col(c) for c in SLOT_KEY).hash_rows(seed=0)


def _may_repeat_a_slot(df: pl.DataFrame) -> bool:
    """False when no two rows can share a slot: no two slot hashes are equal (a hash and a radix sort,
    ~5x faster than polars' exact `is_duplicated` on the key; equal hashes go to the exact check)."""
    h = slot_hashes(df).sort().to_numpy()  # [N]
    return bool((h[1:] == h[:-1]).any())


def check_values(df: pl.DataFrame, path, k: int | None, first_row: int = 0, slots: bool = True) -> None:
    """Value checks of the columns read from one file (or of its rows from `first_row` on); raise TraceError
    naming file, column, row. `slots`: also refuse two rows of one draft slot (out of core a shard is
    checked chunk by chunk, and fit/data.py `SlotKeys` checks its slots across every chunk instead)."""
    if df.height == 0:
        raise TraceError(f"{path}: holds no rows")
    checks = [ch for ch in _value_checks(k) if set(ch[1].meta.root_names()) <= set(df.columns)]  # what was read
    hits = df.select(e.fill_null(False).any().alias(str(i)) for i, (_, e, _) in enumerate(checks)).row(0)
    for (column, bad, what), hit in zip(checks, hits):
        if hit:
            raise TraceError(f"{path}: column {column!r} {what}: "
                             f"{_first_bad(df, bad.fill_null(False), column, first_row)}")
    if slots and set(SLOT_KEY) <= set(df.columns) and _may_repeat_a_slot(df):
        dup = df.select(SLOT_KEY).is_duplicated()
        if dup.any():
            i = int(dup.arg_true()[0])
            raise duplicate_slot(path, i, df.select(SLOT_KEY).row(i))


def duplicate_slot(path, row: int, key: tuple) -> TraceError:
    """The one line refusing a trace whose row `row` repeats the draft slot `key` (SLOT_KEY's values)."""
    shown = ", ".join(f"{n}={v}" for n, v in zip(SLOT_KEY, key))
    return TraceError(f"{path}: row {row} duplicates another row of the same draft slot ({shown}); "
                      "it would be counted twice")


__all__ = ["FINITE_COLUMNS", "MAX_INFERRED_K", "PROBABILITY_COLUMNS", "SLOT_KEY", "check_values", "duplicate_slot",
           "slot_hashes"]
