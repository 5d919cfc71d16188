"""Pass 0 of the out-of-core fit: read each shard once in chunks, check it, spill its observed slots.

  spill   each chunk of `rows` rows is checked (`values.check_values`, the in-memory read's
          checks on the same columns, its rows named by their place in the shard), its observed
          slots' features derived (float64, the same polars expressions as the in-memory fit),
          sorted by position and written as one raw array file per column and chunk into the
          scratch directory; later passes read back only the columns they need (no
          decompression, no unobserved rows)
  survey  what pass 0 learns about a shard (`ShardSurvey`, small: it travels back from a Ray
          worker): rows, observed rows, datasets, null counts, engine steps by both clocks, and
          a uniform sample of its observed slots (the AUC histogram's bin edges)
  slots   no two rows of one draft slot (`values.SLOT_KEY`) across a whole shard (the in-memory read
          checks a file at once): each chunk's keys are hashed (uint64; strings as strings, so chunks
          agree) and the (hash, row) pairs spilled into PARTS files by the hash's top bits; at the end
          each file is sorted on its own (16 B per row / PARTS) and rows of equal hash are compared
          exactly. The first repeated slot is reported by `values.duplicate_slot`, as the in-memory
          read reports it, so the in-memory and out-of-core fits refuse the same traces with the same line.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from avkit.errors import TraceError
from avkit.features import FEATURES
from avkit.fit.data import TRACE_COLUMNS, fitted, request_step_starts
from avkit.trace.reader import CHECKED_COLUMNS, scan_traces
from avkit.trace.values import SLOT_KEY, check_values, duplicate_slot, slot_hashes

MAX_K = 64  # positions a survey can hold before K is known (traces without avkit.k)
PARTS = 64  # partitions by the top 6 bits of the hash


class SlotKeys:
    """The slot hashes of one shard, spilled in `directory` chunk by chunk."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def add(self, df: pl.DataFrame, first_row: int) -> None:
        """Spill the hashes of a chunk whose first row is row `first_row` of the shard."""
        h = slot_hashes(df, across_frames=True).to_numpy()  # [n]
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
            raise duplicate_slot(path, *first)


@dataclass
class ShardSurvey:
    """What pass 0 learned about one shard (small: travels back from a worker)."""

    path: str
    spill: str  # directory of the spilled columns: c{chunk}.{column}
    rows: int
    observed: int
    dataset_names: list[str]  # the spill's dataset codes index this list
    datasets: dict[str, int]  # name -> observed slots
    sample: dict[str, np.ndarray]  # feature -> [S] a uniform sample of the observed slots (AUC bin edges)
    nulls: dict[str, int]  # feature -> observed slots where it is null
    num_positions: int = 0  # max observed position + 1
    chunk_counts: list[np.ndarray] = field(default_factory=list)  # [C] x [MAX_K] observed slots per position
    sample_positions: list[np.ndarray] = field(default_factory=list)  # [S] positions of the sample
    all_step_nulls: int = 0  # rows (observed or not) without engine_step
    steps_by_engine_step: int = 0  # engine steps counted by the engine_step clock
    steps_by_request: int = 0  # ... by the (request_id, step) clock
    last: tuple = (None, None)
    drafted: dict[str, list] = field(default_factory=dict)  # dataset -> [rows, sum of entropy]: every drafted slot

    def column(self, chunk: int, name: str, dtype) -> np.ndarray:
        return np.fromfile(Path(self.spill) / f"c{chunk}.{name}", dtype=dtype)

    def chunks(self, k: int, dataset_names: list[str]):
        """-> per chunk (index, [K] rows per position, [n] positions, [n] labels float64, [n] dataset codes
        into `dataset_names`); the rows are sorted by position."""
        lut = np.array([dataset_names.index(n) for n in self.dataset_names] or [0], dtype=np.int64)
        for c, counts in enumerate(self.chunk_counts):
            yield (c, counts[:k], np.repeat(np.arange(k), counts[:k]),
                   self.column(c, "label", np.int8).astype(np.float64), lut[self.column(c, "dataset", np.int16)])



def spill_shard(path: str, index: int, k: int | None, scratch: str, rows: int, sample: int,
                drafts: bool = False) -> ShardSurvey:
    """Pass 0 over one shard: check, keep the observed slots, survey them (`drafts`: and count every
    drafted slot per dataset, for `avkit report`)."""
    # the columns (and so the checks) of the in-memory fit: what it fits on and what read_traces checks
    lf = scan_traces([path]).select(*dict.fromkeys([*TRACE_COLUMNS, *CHECKED_COLUMNS]))
    spill = Path(scratch) / f"{index:06d}"
    shutil.rmtree(spill, ignore_errors=True)  # a rerun (retried task) starts afresh
    spill.mkdir(parents=True)
    keys = SlotKeys(spill / "slots")  # a slot repeated across chunks (each chunk checks its own rows)
    total = lf.select(pl.len()).collect().item()
    s = ShardSurvey(path, str(spill), total, 0, [], {}, {n: [] for n in FEATURES}, dict.fromkeys(FEATURES, 0))
    rng = np.random.default_rng(index)  # the sample is a function of the shard: reruns agree
    for off in range(0, total, rows):
        try:
            df = lf.slice(off, rows).collect()
        except (pl.exceptions.PolarsError, OSError) as e:
            raise TraceError(f"{path}: cannot read rows {off}..{off + rows - 1}: "
                             f"{str(e).splitlines()[0]}") from None
        check_values(df, path, k, first_row=off, slots=False)  # the in-memory read's lines (SlotKeys: the slots)
        keys.add(df, off)
        _count_steps(s, df)
        if drafts:
            count_drafts(df, s.drafted)
        obs = df.filter(fitted("model"))
        _survey_chunk(s, obs.sort("position", maintain_order=True), rng, sample / max(total, 1))
    keys.check(path, lf)
    shutil.rmtree(keys.dir, ignore_errors=True)
    s.sample = {n: np.concatenate(v) for n, v in s.sample.items()}
    s.sample_positions = np.concatenate(s.sample_positions)
    return s


def _count_steps(s: ShardSurvey, df: pl.DataFrame) -> None:
    """Engine steps of the chunk by both clocks of fit/data.py (rows in file order; the last step of the
    previous chunk carried), and the engine_step nulls that choose between them."""
    s.all_step_nulls += df["engine_step"].null_count()
    es = df["engine_step"].fill_null(-1).to_numpy()
    if df.height:
        s.steps_by_engine_step += int(np.count_nonzero(np.r_[es[0] != s.last[0], es[1:] != es[:-1]]))
        s.steps_by_request += int(np.count_nonzero(request_step_starts(df, s.last[1])))
        s.last = (es[-1], (df["request_id"].cast(pl.String)[-1], df["step"][-1]))


def count_drafts(df: pl.DataFrame, drafted: dict[str, list]) -> dict[str, list]:
    """Add `df`'s drafted slots and their summed draft entropy per dataset, observed or not, into
    `drafted` (dataset -> [rows, sum of entropy]: `avkit report`); -> `drafted`."""
    agg = df.group_by(pl.col("dataset").cast(pl.String)).agg(pl.len(), pl.col("entropy").cast(pl.Float64).sum())
    for name, n, h in agg.iter_rows():
        acc = drafted.setdefault(name, [0, 0.0])
        acc[0], acc[1] = acc[0] + n, acc[1] + h
    return drafted


def _survey_chunk(s: ShardSurvey, obs: pl.DataFrame, rng: np.random.Generator, rate: float) -> None:
    """Add one chunk's observed slots (sorted by position) to the survey and spill them."""
    ds = obs["dataset"].cast(pl.String)
    for name in ds.unique(maintain_order=True).to_list():
        if name not in s.dataset_names:
            s.dataset_names.append(name)
            s.datasets[name] = 0
    for name, n in ds.value_counts().iter_rows():
        s.datasets[name] += n
    s.observed += obs.height
    derived = obs.select(*(spec.expr.alias(n) for n, spec in FEATURES.items()))
    pos = obs["position"].to_numpy()
    if pos.size:
        s.num_positions = max(s.num_positions, int(pos[-1]) + 1)  # sorted
    c = len(s.chunk_counts)
    s.chunk_counts.append(np.bincount(pos, minlength=MAX_K))
    pick = rng.random(obs.height) < rate  # [n] the chunk's share of the shard's sample
    s.sample_positions.append(pos[pick])
    out = Path(s.spill)
    for n in FEATURES:
        s.nulls[n] += derived[n].null_count()
        values = derived[n].to_numpy().astype(np.float64)  # nulls become nan
        values.tofile(out / f"c{c}.{n}")
        s.sample[n].append(values[pick])
    code = ds.replace_strict(s.dataset_names, list(range(len(s.dataset_names))), return_dtype=pl.Int16)
    code.to_numpy().tofile(out / f"c{c}.dataset")
    obs["accepted"].cast(pl.Int8).to_numpy().tofile(out / f"c{c}.label")
