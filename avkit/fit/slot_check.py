"""No two rows of one draft slot across a whole shard, out of core (the in-memory read checks a file at once).

A slot is its key `values.SLOT_KEY` (run_id, request_id, drafter, step, position). Each chunk's
rows are hashed (uint64 of the key's values, strings hashed as strings so chunks agree) and the
(hash, row) pairs appended to one of PARTS files by the hash's top bits; at the end each file is
sorted by hash on its own (memory: 16 B per row / PARTS) and rows of equal hash are compared
exactly. The first repeated slot is reported as `values.check_values` reports it, naming the shard and
the row, so the in-memory and out-of-core fits refuse the same traces with the same line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from avkit.errors import TraceError
from avkit.trace.values import SLOT_KEY

PARTS = 64  # partitions by the top 6 bits of the hash


def _hashes(df: pl.DataFrame) -> np.ndarray:
    """[N] uint64 hash of each row's slot key (Categorical columns as their strings)."""
    key = df.select(pl.col(c).cast(pl.String) if df.schema[c] == pl.Categorical else pl.col(c) for c in SLOT_KEY)
    return key.hash_rows(seed=0).to_numpy()


class SlotKeys:
    """The slot hashes of one shard, spilled in `directory` chunk by chunk."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def add(self, df: pl.DataFrame, first_row: int) -> None:
        """Spill the hashes of a chunk whose first row is row `first_row` of the shard."""
        h = _hashes(df)  # [n]
        rows = np.arange(first_row, first_row + len(h), dtype=np.int64)  # [n]
        part = (h >> np.uint64(58)).astype(np.uint8)  # [n]
        order = np.argsort(part, kind="stable")  # radix sort by partition
        edges = np.searchsorted(part[order], np.arange(PARTS + 1))  # [PARTS + 1]
        for j in np.flatnonzero(np.diff(edges)):
            sel = order[edges[j]:edges[j + 1]]
            with open(self.dir / f"p{j}.hash", "ab") as fh:
                h[sel].tofile(fh)
            with open(self.dir / f"p{j}.row", "ab") as fh:
                rows[sel].tofile(fh)

    def check(self, path: str, lf: pl.LazyFrame) -> None:
        """Raise TraceError at the first row (in shard order) whose slot another row repeats."""
        first = None
        for j in range(PARTS):
            hf = self.dir / f"p{j}.hash"
            if not hf.exists():
                continue
            h, rows = np.fromfile(hf, dtype=np.uint64), np.fromfile(self.dir / f"p{j}.row", dtype=np.int64)
            order = np.argsort(h, kind="stable")  # rows stay in shard order within equal hashes
            h, rows = h[order], rows[order]
            same = np.flatnonzero(h[1:] == h[:-1])  # [M] candidate pairs (earlier row, later row)
            for i in same:
                a, b = int(rows[i]), int(rows[i + 1])
                key_a, key_b = (lf.slice(r, 1).select(SLOT_KEY).collect().row(0) for r in (a, b))
                if key_a == key_b and (first is None or a < first[0]):
                    first = (a, key_a)
        if first is not None:
            key = ", ".join(f"{n}={v}" for n, v in zip(SLOT_KEY, first[1]))
            raise TraceError(f"{path}: row {first[0]} duplicates another row of the same draft slot ({key}); "
                             "it would be counted twice")


__all__ = ["PARTS", "SlotKeys"]
