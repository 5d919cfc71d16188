"""The batch fit's shard (`Shard`: held in memory, or spilled) and pass 0 of the out-of-core fit: read each shard
once in chunks (fit/data.py `read_shard`, the in-memory fit's reader: the same checks, lines and clock), spill its
observed slots, survey it.

  spill   each chunk's observed slots' features are derived (float64, the same polars expressions as
          the in-memory fit), sorted by position and written as one raw array file per column and
          chunk into the scratch directory; later passes read back only the columns they need (no
          decompression, no unobserved rows)
  survey  what pass 0 learns about a shard (in its `Shard`, small: it travels back from a Ray
          worker): rows, observed rows, datasets, null counts, engine steps, and a uniform sample
          of its observed slots (the AUC histogram's bin edges)
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from avkit.estimators.irls import group_by_position
from avkit.features import FEATURES
from avkit.fit.data import TRACE_COLUMNS, FitData, count_drafts, read_shard
from avkit.metrics.table import ScoreLayout

MAX_K = 64  # positions a survey can hold before K is known (traces without avkit.k)
HELD_CHUNK = 1 << 20  # rows per chunk of a held shard (a chunk's [n] oriented feature copy: 8 MB)


@dataclass
class Shard:
    """One shard of the batch fit: its observed slots in chunks, each sorted by position, and what pass 0 learned
    about it (small: travels back from a worker). Spilled: the columns are raw arrays in `spill`; held (`--engine
    memory`, `Shard.of`): every observed slot in memory in HELD_CHUNK-row chunks, scored exactly (`layout`)."""

    path: str
    spill: str  # directory of the spilled columns: c{chunk}.{column} ("": held)
    rows: int = 0
    observed: int = 0
    dataset_names: list[str] = field(default_factory=list)  # the chunks' dataset codes index this list
    datasets: dict[str, int] = field(default_factory=dict)  # name -> observed slots
    # feature -> [S] a uniform sample of the observed slots (the AUC bins' edges)
    sample: dict[str, list] = field(default_factory=lambda: {n: [] for n in FEATURES})
    nulls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FEATURES, 0))  # feature -> null slots
    num_positions: int = 0  # max observed position + 1
    chunk_counts: list[np.ndarray] = field(default_factory=list)  # [C] x [>= K] observed slots per position
    sample_positions: list[np.ndarray] = field(default_factory=list)  # [S] positions of the sample
    clock: str = "engine_step"  # fit/data.py CLOCKS
    steps: int = 0  # engine steps
    drafted: dict[str, list] = field(default_factory=dict)  # dataset -> [rows, sum of entropy]: every drafted slot
    held: dict[str, np.ndarray] = field(default_factory=dict)  # held: column (and "position") -> [N] sorted
    layout: ScoreLayout | None = None  # held: the exact scores' layout

    @classmethod
    def of(cls, data: FitData, n_bins: int) -> Shard:
        """`data`'s observed slots held, sorted stably by position; its features move through one spare [N]
        buffer (each popped writable column the next one's target: no fresh pages per feature)."""
        order = group_by_position(data.positions)
        pos = np.repeat(np.arange(data.k), np.bincount(data.positions, minlength=data.k))  # [N] sorted: no gather
        y, ds, spare, held = data.labels[order], data.dataset_codes[order], np.empty(order.size), {}
        for name in list(data.features):
            column = data.features.pop(name)
            held[name] = np.take(column, order, out=spare)
            spare = column if column.flags.writeable else np.empty(order.size)
        counts = [np.bincount(pos[lo:lo + HELD_CHUNK], minlength=data.k) for lo in range(0, y.size, HELD_CHUNK)]
        return cls("", "", observed=y.size, dataset_names=data.dataset_names, chunk_counts=counts,
                   held={**held, "label": y, "dataset": ds, "position": pos},
                   layout=ScoreLayout(y, pos, ds, data.dataset_names, n_bins))

    def column(self, chunk: int, name: str, dtype) -> np.ndarray:
        if self.held:
            return self.held[name][chunk * HELD_CHUNK:(chunk + 1) * HELD_CHUNK]
        return np.fromfile(Path(self.spill) / f"c{chunk}.{name}", dtype=dtype)

    def chunks(self, k: int, dataset_names: list[str]):
        """-> per chunk (index, [K] rows per position, [n] positions, [n] labels float64, [n] dataset codes
        into `dataset_names`); the rows are sorted by position."""
        lut = np.array([dataset_names.index(n) for n in self.dataset_names] or [0], dtype=np.int64)
        for c, counts in enumerate(self.chunk_counts):
            yield (c, counts[:k], np.repeat(np.arange(k), counts[:k]),
                   self.column(c, "label", np.int8).astype(np.float64), lut[self.column(c, "dataset", np.int16)])


def spill_shard(path: str, index: int, k: int | None, scratch: str, rows: int, sample: int,
                drafts: bool = False) -> Shard:
    """Pass 0 over one shard: check, keep the observed slots, survey them (`drafts`: and count every
    drafted slot per dataset, for `avkit report`)."""
    spill = Path(scratch) / f"{index:06d}"
    shutil.rmtree(spill, ignore_errors=True)  # a rerun (retried task) starts afresh
    spill.mkdir(parents=True)
    s, seen = Shard(path, str(spill)), []
    rng = np.random.default_rng(index)  # the sample is a function of the shard: reruns agree
    for total, df, observed, clock, s.clock in read_shard(path, k, TRACE_COLUMNS, "model", rows, spill / "slots"):
        s.rows = total
        seen.append(np.unique(clock))
        if drafts:
            count_drafts(df, s.drafted)
        obs = df.filter(pl.Series(observed)).sort("position", maintain_order=True)
        _survey_chunk(s, obs, rng, sample / max(total, 1))
    s.steps = np.unique(np.concatenate(seen)).size
    s.sample = {n: np.concatenate(v) for n, v in s.sample.items()}
    s.sample_positions = np.concatenate(s.sample_positions)
    return s


def _survey_chunk(s: Shard, obs: pl.DataFrame, rng: np.random.Generator, rate: float) -> None:
    """Add one chunk's observed slots (sorted by position) to the survey and spill them."""
    ds = obs["dataset"].cast(pl.String)
    counts = dict(ds.value_counts().iter_rows())
    for name in ds.unique(maintain_order=True).to_list():  # new names coded in order of appearance
        s.datasets[name] = s.datasets.get(name, 0) + counts[name]
    s.dataset_names = list(s.datasets)
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
    code.to_numpy().astype(np.int16).tofile(out / f"c{c}.dataset")  # (an empty chunk's codes come back as objects)
    obs["accepted"].cast(pl.Int8).to_numpy().tofile(out / f"c{c}.label")
