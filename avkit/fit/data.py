"""The one reader of a fit: each trace file read once in chunks, checked, reduced to its observed slots;
held in memory in engine-step order (`load_fit_data`, ready to replay) or spilled (fit/spill.py).

  observed    verified and at or before the first rejection: `accepted` is not null   [N rows]
  engine step the clock of the online rounds: a file's complete `engine_step` column (rows ordered
              stably by it), else each contiguous (request_id, step) group of rows in file order (exact
              at batch 1; never the per-request `step`, which would merge every request's step s).
              A file's engine steps are the distinct values of its clock; a step whose slots were all
              censored still counts (it is empty here), as it does live
  run         each file is one run (a server process): rounds never span files (estimators/rounds.py)
  drafter     the rows fitted are one drafter's: "model" or "suffix" (the hybrid drafter's cache rows);
              the other drafter's rows still tick the clock, as they do live
  chunk       `rows` rows of a file in file order (None: the whole file), value-checked as read
              (`values.check_values`, its rows named by their place in the file)
  slots       no two rows of one draft slot (`values.SLOT_KEY`) in a file: checked whole in memory, or each
              chunk's keys hashed (uint64; strings as strings, so chunks agree) and the (hash, row) pairs
              spilled into PARTS files by the hash's top bits; after the last chunk each part is sorted
              and rows of equal hash compared exactly (`values.duplicate_slot` names the first)
"""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from avkit.errors import TraceError, first_line
from avkit.features import FEATURES
from avkit.trace.reader import CHECKED_COLUMNS, common_k, no_repeats, scan_traces, trace_k, trace_metadata
from avkit.trace.values import SLOT_KEY, check_values, duplicate_slot, slot_hashes

TRACE_COLUMNS = ("engine_step", "request_id", "step", "position", "dataset", "drafter", "accepted", "verified", "q_max",
                 "q_2nd", "q_sampled", "entropy", "logit_qmax", "head_conf")
CLOCKS = {"engine_step": "engine_step column",
          "request_step": "contiguous (request_id, step) groups in file order (no engine_step column)"}
# what the observed slots keep after the read: the features' inputs, labels, positions, datasets
FEATURE_INPUTS = ("q_max", "q_2nd", "q_sampled", "entropy", "logit_qmax", "head_conf")
OBSERVED_COLUMNS = ("position", "dataset", "accepted", *FEATURE_INPUTS)
PARTS = 64  # partitions of spilled slot hashes, by the top 6 bits of the hash


@dataclass
class FitData:
    k: int  # draft positions K
    features: dict[str, np.ndarray]  # name -> [N] float64 (raw, not oriented)
    positions: np.ndarray  # [N] intp
    labels: np.ndarray  # [N] float64 in {0, 1}
    row_step: np.ndarray  # [N] int64 engine step (0..G-1) of each observed row, non-decreasing
    step_file: np.ndarray  # [G] file index of each engine step
    step_clock: np.ndarray  # [G] its recorded engine_step, or its ordinal in the file (no engine_step)
    dataset_codes: np.ndarray  # [N] int64 into dataset_names
    dataset_names: list[str]
    trained_on: dict = field(default_factory=dict)

    @property
    def step_bounds(self) -> np.ndarray:
        """[G + 1] first observed row of each engine step (equal bounds: a step with no observed slot)."""
        return np.searchsorted(self.row_step, np.arange(self.step_file.size + 1))

    @property
    def clock(self) -> str:
        return self.trained_on.get("clock", "engine_step")

    def runs(self):
        """-> (step slice, row slice) of each file (run), in order."""
        edges = np.r_[0, np.flatnonzero(self.step_file[1:] != self.step_file[:-1]) + 1, self.step_file.size]
        bounds = self.step_bounds
        for lo, hi in itertools.pairwise(edges):
            yield slice(int(lo), int(hi)), slice(int(bounds[lo]), int(bounds[hi]))


class SlotKeys:
    """The slot hashes of one file read in chunks, spilled into `directory`."""

    def __init__(self, directory: Path):
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)

    def add(self, df: pl.DataFrame, first_row: int) -> None:
        """Keep the hashes of a chunk whose first row is row `first_row` of the file."""
        h = slot_hashes(df, across_frames=True).to_numpy()  # [n]
        rows = np.arange(first_row, first_row + len(h), dtype=np.int64)  # [n]
        part = (h >> np.uint64(58)).astype(np.uint8)  # [n]
        order = np.argsort(part, kind="stable")  # radix sort by partition
        edges = np.searchsorted(part[order], np.arange(PARTS + 1))  # [PARTS + 1]
        for j in np.flatnonzero(np.diff(edges)):
            sel = order[edges[j]:edges[j + 1]]
            for suffix, values in (("hash", h), ("row", rows)):
                with open(self.dir / f"p{j}.{suffix}", "ab") as fh:
                    values[sel].tofile(fh)

    def check(self, path, lf: pl.LazyFrame) -> None:
        """Raise TraceError at the first row (in file order) whose slot another row repeats."""
        first = None
        for j in range(PARTS):
            if not (self.dir / f"p{j}.hash").exists():
                continue
            h, rows = np.fromfile(self.dir / f"p{j}.hash", np.uint64), np.fromfile(self.dir / f"p{j}.row", np.int64)
            order = np.argsort(h, kind="stable")  # rows stay in file order within equal hashes
            h, rows = h[order], rows[order]
            for i in np.flatnonzero(h[1:] == h[:-1]):  # candidate pairs (earlier row, later row)
                a, b = int(rows[i]), int(rows[i + 1])
                key_a, key_b = (lf.slice(r, 1).select(SLOT_KEY).collect().row(0) for r in (a, b))
                if key_a == key_b and (first is None or a < first[0]):
                    first = (a, key_a)
        shutil.rmtree(self.dir, ignore_errors=True)
        if first is not None:
            raise duplicate_slot(path, *first)


def step_clock(df: pl.DataFrame, name: str, last: tuple = (-1, None)) -> np.ndarray:
    """[rows] int64 engine-step clock `name` of rows in file order: their engine_step, or the ordinal of each
    contiguous (request_id, step) group (`last`: (ordinal, (request_id, step)) of the row before the first)."""
    if name == "engine_step":
        return df["engine_step"].to_numpy().astype(np.int64)
    rid = df["request_id"].cast(pl.String)
    new = ((rid != rid.shift(1)) | (df["step"] != df["step"].shift(1))).fill_null(True).to_numpy()
    if last[1] is not None and df.height:
        new[0] = (rid[0], df["step"][0]) != last[1]
    return last[0] + np.cumsum(new)


def replay_order(df: pl.DataFrame, clock: np.ndarray) -> tuple[pl.DataFrame, np.ndarray]:
    """A file's rows and [rows] clock ordered stably by the clock (recorders write in step order: rare)."""
    if clock.size > 1 and bool((clock[1:] < clock[:-1]).any()):
        order = np.argsort(clock, kind="stable")
        return df[order], clock[order]
    return df, clock


def file_clock(df: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray, str]:
    """One whole file's rows -> (rows in replay order, [rows] int64 clock, which clock)."""
    name = "engine_step" if df["engine_step"].null_count() == 0 else "request_step"
    return *replay_order(df, step_clock(df, name)), name


def read_shard(path, k: int | None, columns, drafter: str = "model", rows: int | None = None,
               slots: Path | None = None):
    """Read trace file `path` once, checked at K `k`: whole, or in chunks of `rows` rows whose slot keys
    spill into directory `slots` (`SlotKeys`) -> per chunk (rows in the file, frame of `columns` in file
    order, [n] bool observed slots of `drafter`, [n] int64 engine-step clock, its name in CLOCKS)."""
    lf = scan_traces([path]).select(*dict.fromkeys([*columns, *CHECKED_COLUMNS]))
    total, nulls = lf.select(pl.len(), pl.col("engine_step").null_count()).collect().row(0)
    name, last = "engine_step" if nulls == 0 else "request_step", (-1, None)
    keys = None if rows is None else SlotKeys(slots)
    for off in range(0, max(total, 1), rows or max(total, 1)):
        try:
            df = lf.slice(off, rows or total).collect()
        except (pl.exceptions.PolarsError, pl.exceptions.PanicException, OSError) as e:
            raise TraceError(f"{path}: cannot read rows {off}..{off + (rows or total) - 1}: "
                             f"{first_line(e)}") from None
        check_values(df, path, k, first_row=off, slots=keys is None)  # in chunks: SlotKeys, over every chunk
        if keys is not None:
            keys.add(df, off)
        clock = step_clock(df, name, last)
        last = (int(clock[-1]), (df["request_id"].cast(pl.String)[-1], df["step"][-1]))
        observed = df.select(fitted(drafter)).to_series().to_numpy()  # (a categorical compares its few categories)
        yield total, df, observed, clock, name
    if keys is not None:
        keys.check(path, lf)


def shown(path: Path) -> str:
    """A trace path as a shipped file should name it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def fitted(drafter: str = "model") -> pl.Expr:
    """The rows a fit learns from: observed (`accepted` not null: trace/labels.py) and drafted by `drafter`."""
    return pl.col("accepted").is_not_null() & (pl.col("drafter") == drafter)


def feature_inputs(features) -> list[str]:
    """The trace columns the polars expressions of `features` (names of FEATURES) read, in FEATURE_INPUTS order."""
    used = {c for n in features for c in FEATURES[n].expr.meta.root_names()}
    return [c for c in FEATURE_INPUTS if c in used]


def count_drafts(df: pl.DataFrame, drafted: dict[str, list]) -> dict[str, list]:
    """Add `df`'s drafted slots and their summed draft entropy per dataset, observed or not, into
    `drafted` (dataset -> [rows, sum of entropy]: `avkit report`); -> `drafted`."""
    agg = df.group_by(pl.col("dataset").cast(pl.String)).agg(pl.len(), pl.col("entropy").cast(pl.Float64).sum())
    return add_drafts(drafted, {name: (n, h) for name, n, h in agg.iter_rows()})


def add_drafts(drafted: dict[str, list], more: dict) -> dict[str, list]:
    """`drafted` += `more` (dataset -> (rows, sum of entropy), as `count_drafts` counts them); -> `drafted`."""
    for name, (n, h) in more.items():
        acc = drafted.setdefault(name, [0, 0.0])
        acc[0], acc[1] = acc[0] + n, acc[1] + h
    return drafted


def _dataset_codes(ds: pl.Series) -> tuple[np.ndarray, list[str]]:
    """[N] dataset names -> ([N] int64 codes into the sorted names, sorted names)."""
    names = sorted(ds.unique().cast(pl.String).to_list())
    return ds.cast(pl.Enum(names)).to_physical().to_numpy().astype(np.int64), names


def load_fit_data(paths, drafter: str = "model", features=None, drafted: dict[str, list] | None = None) -> FitData:
    """Read, check and order the observed slots of `drafter`'s rows in `paths` (`read_shard`, a file at a
    time, each reduced to its observed slots' OBSERVED_COLUMNS before the next); raise TraceError on
    unusable input. `features`: derive only these (names of FEATURES; None: every one) from their inputs.
    `drafted`: also count every drafted slot of the read into it (`count_drafts`, features None)."""
    paths = [Path(p) for p in paths]
    no_repeats(paths)
    names = list(FEATURES) if features is None else [n for n in FEATURES if n in features]
    inputs = feature_inputs(names)
    columns = [c for c in TRACE_COLUMNS if c not in FEATURE_INPUTS or c in inputs]
    kept = [c for c in OBSERVED_COLUMNS if c not in FEATURE_INPUTS or c in inputs]
    parts, steps, row_step, clocks, total = [], [], [], [], 0
    for path in paths:
        [(rows, df, observed, clock, name)] = read_shard(path, trace_k(path), columns, drafter=drafter)  # one chunk
        if drafted is not None:
            count_drafts(df, drafted)
        values = np.unique(clock)  # [G_i] the file's engine steps
        df, clock = replay_order(df.select(kept).filter(pl.Series(observed)), clock[observed])
        row_step.append(np.searchsorted(values, clock) + sum(v.size for v in steps))
        parts.append(df)
        steps.append(values)
        clocks.append(name)
        total += rows
    obs = pl.concat(parts, how="vertical") if len(parts) > 1 else parts[0]
    if obs.height == 0:
        raise no_observed(paths, drafter)
    derived = obs.select(FEATURES[name].expr.alias(name) for name in names)  # one parallel pass
    features = {name: derived[name].to_numpy().astype(np.float64, copy=False) for name in derived.columns
                if derived[name].null_count() == 0}  # optional columns (head_conf) count only when complete
    codes, names = _dataset_codes(obs["dataset"])
    positions = obs["position"].to_numpy().astype(np.intp)
    step_clocks = np.concatenate(steps)
    return FitData(
        k=max(common_k(paths)[0] or 0, int(positions.max()) + 1), features=features, positions=positions,
        labels=obs["accepted"].cast(pl.Float64).to_numpy(), row_step=np.concatenate(row_step),
        step_file=np.repeat(np.arange(len(steps)), [v.size for v in steps]), step_clock=step_clocks,
        dataset_codes=codes, dataset_names=names,
        trained_on=trained_on(paths, trace_metadata(paths[0]), total, obs.height,
                              dict(zip(names, np.bincount(codes, minlength=len(names)).tolist())), drafter,
                              clocks, step_clocks.size))


def no_observed(paths, drafter: str) -> TraceError:
    """The one line refusing traces with no observed slot of `drafter`, in memory or out of core."""
    return TraceError(f"{', '.join(map(str, paths))}: no observed labels of drafter {drafter!r} (every "
                      f"`accepted` of its rows is null, or column `drafter` never says {drafter!r})")


def trained_on(paths, meta: dict, slots: int, observed: int, datasets: dict[str, int], drafter: str,
               clocks: list[str], engine_steps: int) -> dict:
    """coefficients.json's `trained_on`: the traces, what they held, the model pair (first shard's metadata)."""
    return {"traces": [shown(Path(p)) for p in paths], "slots": slots, "observed": observed,
            "datasets": datasets, "drafter": drafter, **{k: meta.get(f"avkit.{k}", "") for k in
                                                        ("target", "draft", "target_sha256", "draft_sha256")},
            "clock": clocks[0] if len(set(clocks)) == 1 else "mixed", "clock_per_file": clocks,
            "engine_steps": engine_steps,
            "synthetic_truth": json.loads(meta["avkit.synthetic"]) if "avkit.synthetic" in meta else None}
