"""The observed slots of a trace set, as numpy arrays in engine-step order, ready to replay.

Glossary:
  observed    verified and at or before the first rejection: `accepted` is not null   [N rows]
  engine step the clock of the online rounds (the estimator refits every `refit_interval` of them).
              A file with a complete `engine_step` column uses it (rows ordered stably by it). A
              file without one (schema v1 makes it optional) takes each contiguous (request_id, step)
              group of rows, in file order, as one engine step: exact at batch 1, and a file written
              step by step at batch B gives B times as many, smaller steps. Rows are never reordered
              by the per-request `step` (that would merge every request's step s into one "step").
  step bounds [G + 1] first observed row of each engine step; a step whose slots were all censored
              is still a step (it is empty here), as it is for the live estimator
  run         each file is its own run (a server process): rounds never span files, and a file's
              trailing partial round is dropped (estimators/rounds.py)
  drafter     the rows fitted are one drafter's (the trace's `drafter`): "model" (the draft model) or
              "suffix" (the hybrid drafter's cache rows, scored live by their own estimator); the
              other drafter's rows still tick the engine-step clock, as they do live
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from avkit.errors import TraceError
from avkit.features import FEATURES
from avkit.trace.reader import common_k, iter_traces, trace_metadata

TRACE_COLUMNS = ("engine_step", "request_id", "step", "position", "dataset", "drafter", "accepted", "verified", "q_max",
                 "q_2nd", "q_sampled", "entropy", "logit_qmax", "head_conf")
CLOCKS = {"engine_step": "engine_step column",
          "request_step": "contiguous (request_id, step) groups in file order (no engine_step column)"}


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


def file_clock(df: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray, str]:
    """One file's rows -> (rows in replay order, [rows] int64 clock, which clock): its engine_step
    (rows ordered stably by it), or, without one, the ordinal of each contiguous (request_id, step) group."""
    if df["engine_step"].null_count() == 0:
        clock = df["engine_step"].to_numpy()
        if clock.size > 1 and bool((clock[1:] < clock[:-1]).any()):  # recorders write in step order: rare
            order = np.argsort(clock, kind="stable")
            df, clock = df[order], clock[order]
        return df, clock, "engine_step"
    return df, np.cumsum(request_step_starts(df)) - 1, "request_step"


def request_step_starts(df: pl.DataFrame, last: tuple | None = None) -> np.ndarray:
    """[rows] bool: the row opens an engine step of the request_step clock, its (request_id, step) differing
    from the row before (`last`: the (request_id, step) of the row before the first; None: a file's start)."""
    rid = df["request_id"].cast(pl.String)
    new = ((rid != rid.shift(1)) | (df["step"] != df["step"].shift(1))).fill_null(True).to_numpy()
    if last is not None and df.height:
        new[0] = (rid[0], df["step"][0]) != last
    return new


def _dataset_codes(ds: pl.Series) -> tuple[np.ndarray, list[str]]:
    """[N] dataset names (Categorical or String) -> ([N] int64 codes into the sorted names, sorted names).
    A Categorical maps its few distinct physical codes, never the N strings."""
    uniq = ds.unique()
    names = sorted(uniq.cast(pl.String).to_list())
    if ds.dtype == pl.Categorical:
        phys = uniq.to_physical().to_numpy().astype(np.int64)  # [D]
        if phys.max() < 1 << 20:
            lut = np.zeros(int(phys.max()) + 1, dtype=np.int64)
            lut[phys] = [names.index(n) for n in uniq.cast(pl.String).to_list()]
            return lut[ds.to_physical().to_numpy()], names
    return ds.cast(pl.String).replace_strict(names, list(range(len(names))), return_dtype=pl.Int64).to_numpy(), names


# what the observed slots keep after the read: the features' inputs, labels, positions, datasets
FEATURE_INPUTS = ("q_max", "q_2nd", "q_sampled", "entropy", "logit_qmax", "head_conf")
OBSERVED_COLUMNS = ("position", "dataset", "accepted", *FEATURE_INPUTS)


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


def load_fit_data(paths, drafter: str = "model", features=None) -> FitData:
    """Read, check and order the observed slots of `drafter`'s rows in `paths`; raise TraceError on unusable
    input. `features`: derive only these (names of FEATURES; None: every one) and read only their inputs.

    File by file: each is read (only TRACE_COLUMNS and the checked ones), checked, put in replay
    order and reduced to its observed slots' OBSERVED_COLUMNS before the next is read."""
    paths = [Path(p) for p in paths]
    names = list(FEATURES) if features is None else [n for n in FEATURES if n in features]
    inputs = feature_inputs(names)
    columns = [c for c in TRACE_COLUMNS if c not in FEATURE_INPUTS or c in inputs]
    kept = [c for c in OBSERVED_COLUMNS if c not in FEATURE_INPUTS or c in inputs]
    parts, step_file, step_clock, row_step, clocks = [], [], [], [], []
    total = steps = 0
    for i, df in enumerate(iter_traces(paths, columns)):
        df, clock, name = file_clock(df)
        first = np.r_[True, clock[1:] != clock[:-1]]  # [n] the row opens an engine step
        observed = df.select(fitted(drafter)).to_series().to_numpy()  # [n] (a categorical compares its few
        # categories, not every row's string)
        row_step.append((np.cumsum(first) - 1)[observed] + steps)
        step_clock.append(clock[first])
        step_file.append(np.full(int(first.sum()), i, dtype=np.int64))
        steps, total = steps + int(first.sum()), total + df.height
        clocks.append(name)
        parts.append(df.select(kept).filter(pl.Series(observed)))
    obs = pl.concat(parts, how="vertical") if len(parts) > 1 else parts[0]
    if obs.height == 0:
        raise TraceError(f"{', '.join(map(str, paths))}: no observed labels of drafter {drafter!r} (every "
                         f"`accepted` of its rows is null, or column `drafter` never says {drafter!r})")
    derived = obs.select(FEATURES[name].expr.alias(name) for name in names)  # one parallel pass
    features = {name: derived[name].to_numpy().astype(np.float64, copy=False) for name in derived.columns
                if derived[name].null_count() == 0}  # optional columns (head_conf) count only when complete
    codes, names = _dataset_codes(obs["dataset"])
    positions = obs["position"].to_numpy().astype(np.intp)
    return FitData(
        k=max(common_k(paths)[0] or 0, int(positions.max()) + 1), features=features, positions=positions,
        labels=obs["accepted"].cast(pl.Float64).to_numpy(), row_step=np.concatenate(row_step),
        step_file=np.concatenate(step_file), step_clock=np.concatenate(step_clock).astype(np.int64),
        dataset_codes=codes, dataset_names=names,
        trained_on=trained_on(paths, trace_metadata(paths[0]), total, obs.height,
                              dict(zip(names, np.bincount(codes, minlength=len(names)).tolist())), drafter,
                              clocks, steps))


def trained_on(paths, meta: dict, slots: int, observed: int, datasets: dict[str, int], drafter: str,
               clocks: list[str], engine_steps: int) -> dict:
    """coefficients.json's `trained_on`: the traces, what they held, the model pair (first shard's metadata)."""
    return {"traces": [shown(Path(p)) for p in paths], "slots": slots, "observed": observed,
            "datasets": datasets, "drafter": drafter, **{k: meta.get(f"avkit.{k}", "") for k in
                                                        ("target", "draft", "target_sha256", "draft_sha256")},
            "clock": clocks[0] if len(set(clocks)) == 1 else "mixed", "clock_per_file": clocks,
            "engine_steps": engine_steps,
            "synthetic_truth": json.loads(meta["avkit.synthetic"]) if "avkit.synthetic" in meta else None}
