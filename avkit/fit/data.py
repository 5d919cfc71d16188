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
from functools import cached_property
from pathlib import Path

import numpy as np
import polars as pl

from avkit.errors import TraceError
from avkit.features import FEATURES
from avkit.trace.reader import read_traces, trace_metadata

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
    file_index: np.ndarray  # [N] int64
    dataset_codes: np.ndarray  # [N] int64 into dataset_names
    dataset_names: list[str]
    trained_on: dict = field(default_factory=dict)

    @property
    def step_bounds(self) -> np.ndarray:
        """[G + 1] first observed row of each engine step (equal bounds: a step with no observed slot)."""
        return np.searchsorted(self.row_step, np.arange(self.step_file.size + 1))

    @cached_property
    def position_order(self) -> np.ndarray:
        """[N] stable permutation grouping the rows by position: one sort shared by every batch fit."""
        from avkit.estimators.online_logistic import group_by_position

        return group_by_position(self.positions)

    @property
    def clock(self) -> str:
        return self.trained_on.get("clock", "engine_step")

    def runs(self):
        """-> (step slice, row slice) of each file (run), in order."""
        edges = np.r_[0, np.flatnonzero(self.step_file[1:] != self.step_file[:-1]) + 1, self.step_file.size]
        bounds = self.step_bounds
        for lo, hi in itertools.pairwise(edges):
            yield slice(int(lo), int(hi)), slice(int(bounds[lo]), int(bounds[hi]))


def _engine_clock(df: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray, list[str]]:
    """-> (rows in replay order, [rows] engine step id in 0..G-1, clock of each file)."""
    parts, clocks = [], []
    for _, part in df.group_by("file_index", maintain_order=True):
        if part["engine_step"].null_count() == 0:
            clocks.append("engine_step")
            if not part["engine_step"].is_sorted():  # recorders write in step order: usually a no-op
                part = part.sort("engine_step", maintain_order=True)
            clock = part["engine_step"]
        else:
            clocks.append("request_step")
            rid = part["request_id"].cast(pl.String)
            new = (rid != rid.shift(1)) | (part["step"] != part["step"].shift(1))
            clock = new.fill_null(True).cast(pl.Int64).cum_sum() - 1
        parts.append(part.with_columns(clock.alias("_clock")))
    rows = pl.concat(parts) if len(parts) > 1 else parts[0]
    fi, ck = rows["file_index"].to_numpy(), rows["_clock"].to_numpy()
    new = np.r_[True, (fi[1:] != fi[:-1]) | (ck[1:] != ck[:-1])] if len(ck) else np.zeros(0, bool)
    return rows, np.cumsum(new) - 1, clocks


def _num_positions(paths: list[Path], positions: np.ndarray) -> int:
    ks = [trace_metadata(p).get("avkit.k", "") for p in paths]
    declared = [int(k) for k in ks if k.isdigit()]
    return max(declared + [int(positions.max()) + 1])


def _shown(path: Path) -> str:
    """A trace path as a shipped file should name it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_fit_data(paths, drafter: str = "model") -> FitData:
    """Read, check and order the observed slots of `drafter`'s rows in `paths`; raise TraceError on unusable input."""
    paths = [Path(p) for p in paths]
    rows, step_id, clocks = _engine_clock(read_traces(paths, list(TRACE_COLUMNS)))
    total = rows.height
    first = np.r_[True, step_id[1:] != step_id[:-1]] if total else np.zeros(0, bool)
    step_file = rows["file_index"].to_numpy()[first].astype(np.int64)  # [G]
    step_clock = rows["_clock"].to_numpy()[first].astype(np.int64)  # [G]
    observed = (rows["accepted"].is_not_null() & (rows["drafter"].cast(pl.String) == drafter)).to_numpy()
    obs = rows.filter(pl.Series(observed))
    if obs.height == 0:
        raise TraceError(f"{', '.join(map(str, paths))}: no observed labels of drafter {drafter!r} (every "
                         f"`accepted` of its rows is null, or column `drafter` never says {drafter!r})")
    derived = obs.select(spec.expr.alias(name) for name, spec in FEATURES.items())  # one parallel pass
    features = {name: derived[name].to_numpy().astype(np.float64, copy=False) for name in derived.columns
                if derived[name].null_count() == 0}  # optional columns (head_conf) count only when complete
    ds = obs["dataset"].cast(pl.String)
    names = sorted(ds.unique().to_list())
    codes = ds.replace_strict(names, list(range(len(names))), return_dtype=pl.Int64).to_numpy()
    positions = obs["position"].to_numpy().astype(np.intp)
    meta = trace_metadata(paths[0])
    clock = clocks[0] if len(set(clocks)) == 1 else "mixed"
    return FitData(
        k=_num_positions(paths, positions), features=features, positions=positions,
        labels=obs["accepted"].cast(pl.Float64).to_numpy(), row_step=step_id[observed], step_file=step_file,
        step_clock=step_clock, file_index=obs["file_index"].cast(pl.Int64).to_numpy(), dataset_codes=codes,
        dataset_names=names,
        trained_on={"traces": [_shown(p) for p in paths], "slots": total, "observed": obs.height,
                    "datasets": {n: int(c) for n, c in zip(names, np.bincount(codes, minlength=len(names)))},
                    "drafter": drafter, "target": meta.get("avkit.target", ""), "draft": meta.get("avkit.draft", ""),
                    "target_sha256": meta.get("avkit.target_sha256", ""),
                    "draft_sha256": meta.get("avkit.draft_sha256", ""), "clock": clock, "clock_per_file": clocks, "engine_steps": int(step_file.size),
                    "synthetic_truth": json.loads(meta["avkit.synthetic"]) if "avkit.synthetic" in meta else None},
    )


__all__ = ["CLOCKS", "TRACE_COLUMNS", "FitData", "load_fit_data"]
