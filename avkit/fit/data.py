"""The observed slots of a trace set, as numpy arrays in engine-step order, ready to replay.

Glossary:
  observed   verified and at or before the first rejection: `accepted` is not null   [N rows]
  round key  (file, engine_step // refit_interval): rows of one live refit round share it; files
             never share a round (each file is its own run). Files without the optional
             `engine_step` column fall back to the per-request `step` (a coarser replay).
Rows are sorted stably by (file, engine_step), so a round is a contiguous slice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from avkit.errors import TraceError
from avkit.features import FEATURES
from avkit.trace.reader import read_traces, trace_metadata

TRACE_COLUMNS = ("engine_step", "step", "position", "dataset", "accepted", "verified", "q_max", "q_2nd",
                 "q_sampled", "entropy", "logit_qmax", "head_conf")


@dataclass
class FitData:
    k: int  # draft positions K
    features: dict[str, np.ndarray]  # name -> [N] float64 (raw, not oriented)
    positions: np.ndarray  # [N] intp
    labels: np.ndarray  # [N] float64 in {0, 1}
    engine_step: np.ndarray  # [N] int64
    file_index: np.ndarray  # [N] int64
    dataset_codes: np.ndarray  # [N] int64 into dataset_names
    dataset_names: list[str]
    trained_on: dict = field(default_factory=dict)

    def round_bounds(self, refit_interval: int) -> np.ndarray:
        """[R + 1] slice bounds of the refit rounds (rows are already in round order)."""
        key = self.file_index * (int(self.engine_step.max()) // refit_interval + 1) \
            + self.engine_step // refit_interval  # [N] non-decreasing
        return np.r_[0, np.flatnonzero(key[1:] != key[:-1]) + 1, len(key)]


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


def load_fit_data(paths) -> FitData:
    """Read, check and order the observed slots of `paths`; raise TraceError on unusable input."""
    paths = [Path(p) for p in paths]
    df = read_traces(paths, list(TRACE_COLUMNS))
    total = df.height
    step_col = "engine_step" if df["engine_step"].null_count() == 0 else "engine_step, else step"
    obs = (df.filter(pl.col("accepted").is_not_null())
           .with_columns(pl.coalesce(pl.col("engine_step"), pl.col("step").cast(pl.Int64)).alias("_round_step")))
    key = obs["file_index"].cast(pl.Int64) * (1 << 40) + obs["_round_step"]  # (file, step) as one int
    if not key.is_sorted():  # recorders write in step order: usually nothing to do
        obs = obs.sort(["file_index", "_round_step"], maintain_order=True)
    if obs.height == 0:
        raise TraceError(f"{', '.join(map(str, paths))}: no observed labels (every `accepted` is null)")
    derived = obs.select(spec.expr.alias(name) for name, spec in FEATURES.items())  # one parallel pass
    features = {name: derived[name].to_numpy().astype(np.float64, copy=False) for name in derived.columns
                if derived[name].null_count() == 0}  # optional columns (head_conf) count only when complete
    ds = obs["dataset"].cast(pl.String)
    names = sorted(ds.unique().to_list())
    codes = ds.replace_strict(names, list(range(len(names))), return_dtype=pl.Int64).to_numpy()
    positions = obs["position"].to_numpy().astype(np.intp)
    meta = trace_metadata(paths[0])
    return FitData(
        k=_num_positions(paths, positions), features=features, positions=positions,
        labels=obs["accepted"].cast(pl.Float64).to_numpy(), engine_step=obs["_round_step"].to_numpy(),
        file_index=obs["file_index"].cast(pl.Int64).to_numpy(), dataset_codes=codes, dataset_names=names,
        trained_on={"traces": [_shown(p) for p in paths], "slots": total, "observed": obs.height,
                    "datasets": {n: int(c) for n, c in zip(names, np.bincount(codes, minlength=len(names)))},
                    "target": meta.get("avkit.target", ""), "draft": meta.get("avkit.draft", ""),
                    "round_step_column": step_col,
                    "synthetic_truth": json.loads(meta["avkit.synthetic"]) if "avkit.synthetic" in meta else None},
    )


__all__ = ["TRACE_COLUMNS", "FitData", "load_fit_data"]
