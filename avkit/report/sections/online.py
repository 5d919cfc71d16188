"""Online fitting: slope and intercepts over refits, and the seeds' role analysis.

Role analysis (seeds 001/002, docs/seeds.md): fit the estimator independently on each dataset and compare with
the dataset's mean draft entropy. In the seeds the slope barely moves across workloads
(0.51-0.55, r = -0.08 against entropy) while the first intercept tracks entropy (r = -0.89): the
slope is a property of the model pair, the intercepts absorb the workload's base acceptance rate.
Here each dataset is fitted to convergence (batch_logistic, the online fit's fixed point) on the
deployed feature; r is Pearson's correlation across datasets, reported from 3 datasets on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from avkit.config import EstimatorConfig
from avkit.markdown import DIGITS, fmt
from avkit.report import plots
from avkit.report.document import Figure, Section, Table, record_table
from avkit.report.inputs import ReportInputs
from avkit.report.traces import MIN_SLOTS

SEEDS_ROLE = ("vLLM PR #52228 write-ups (seeds 001/002, docs/seeds.md; DeepSeek-V4-Flash + DSpark, 5 workloads): "
              "slope 0.51–0.55, r = −0.08; β0 r = −0.89")


ROLE = (("dataset", "dataset", None), ("observed slots", "n", DIGITS), ("acceptance rate", "rate", 3),
        ("mean draft entropy (nats)", "entropy", 3), ("slope ω", "slope", DIGITS), ("intercept β0", "b0", 3))


def pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson r, or None with fewer than 3 points or a constant series."""
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def global_steps(step: np.ndarray, file: np.ndarray | None, names: list[str]) -> tuple[np.ndarray, list]:
    """Per-trace engine steps [R] -> one increasing axis: each trace is offset by the steps of the traces
    before it. -> (x [R], [(x where a later trace starts, its name)]). Without a `file` column (older
    trajectory files) a trace starts wherever the engine step goes backwards.

    Examples
    --------
    >>> global_steps(np.array([100, 200, 100, 300]), np.array([0, 0, 1, 1]), ["a.parquet", "b.parquet"])
    (array([100, 200, 300, 500]), [(200, 'b.parquet')])
    """
    if file is None or (file < 0).any():
        file = np.r_[0, np.cumsum(np.diff(step) < 0)]  # [R]
    ends = np.maximum.reduceat(step, np.r_[0, np.flatnonzero(np.diff(file)) + 1])  # [F'] last step per trace
    offset = np.r_[0, np.cumsum(ends)[:-1]]  # [F'] steps before each trace
    seg = np.r_[0, np.cumsum(np.diff(file) != 0)]  # [R] segment of each round
    x = step + offset[seg]
    starts = [(int(offset[j]), Path(names[f]).name if f < len(names) else f"trace {f + 1}")
              for j, f in enumerate(file[np.r_[0, np.flatnonzero(np.diff(file)) + 1]]) if j > 0]
    return x, starts


def _trajectory_block(traj: pl.DataFrame, c: dict) -> list:
    k = sum(1 for col in traj.columns if col.startswith("intercept_"))
    slope_cols = ["slope"] if "slope" in traj.columns else [f"slope_{i}" for i in range(k)]
    slope = traj.select(pl.mean_horizontal(slope_cols)).to_series().to_numpy()  # [R]
    icpt = traj.select(f"intercept_{i}" for i in range(k)).to_numpy()  # [R, K]
    online = traj["engine_step"].null_count() == 0
    x = traj["engine_step"].to_numpy() if online else traj["round"].to_numpy()
    starts: list[tuple[float, str]] = []
    if online:  # the live estimator starts from the reference constants before its first refit
        x, starts = global_steps(x, traj["file"].to_numpy() if "file" in traj.columns else None,
                                 c.get("trained_on", {}).get("traces", []))
        start = EstimatorConfig()
        x, slope = np.r_[0, x], np.r_[start.init_slope, slope]
        icpt = np.vstack([np.full((1, k), start.init_intercept), icpt])
    xlabel = ("engine step, traces replayed one after another" if online else "Newton iteration (batch fit)")
    half = slope[len(slope) // 2:]
    applied = int(traj["applied"].sum()) if "applied" in traj.columns else len(traj)
    rows = [("slope ω", fmt(float(slope[0])), fmt(float(slope[-1]))),
            *((f"intercept β{i}", fmt(float(icpt[0, i])), fmt(float(icpt[-1, i]))) for i in range(k))]
    table = Table(("", "start" if online else "first iteration", "last refit"), rows,
                  caption=f"{len(traj)} refits, {applied} with a slope step (a slope step that is NaN or makes ω "
                          f"negative is zeroed; the intercepts still step, from the guarded slope step). Over the last half of the refits ω stays in [{half.min():.4f}, {half.max():.4f}].")
    fig = Figure("coefficient_trajectory", f"Slope and intercepts of {c['feature']} ({c['estimator']}) after "
                 "every refit round, replayed in engine-step order as live; each trace's engine steps restart at 0, so "
                 "they are laid end to end (dashed line: the next trace starts, the estimator carries over).",
                 plots.coefficient_trajectory(x, slope, icpt, xlabel, starts), alt="slope and intercepts over refits")
    return [fig, table]


def _role_block(inputs: ReportInputs) -> list:
    fits = inputs.summary.role_fits
    if not fits:
        return [f"Role analysis: no dataset has {MIN_SLOTS} observed first-position slots to fit on its own."]
    ent, slope, b0 = (np.array([f[k] for f in fits]) for k in ("entropy", "slope", "b0"))
    r_slope, r_b0 = pearson(ent, slope), pearson(ent, b0)
    r_text = (f"Across datasets: r(entropy, ω) = {fmt(r_slope, 2)}, r(entropy, β0) = {fmt(r_b0, 2)}."
              if r_b0 is not None else f"r needs at least 3 datasets (here {len(fits)}); the plot shows the points.")
    table = record_table(fits, ROLE, caption=f"Each dataset fitted on its own (batch, "
                                              f"{inputs.fit.coefficients['feature']}). {r_text} {SEEDS_ROLE}.")
    fig = Figure("role_analysis", "Slope and first intercept per dataset against mean draft entropy, with "
                 "Pearson r.", plots.role_analysis(ent, slope, b0, [f["dataset"] for f in fits], r_slope, r_b0),
                 alt="slope and first intercept vs draft entropy")
    return [table, fig]


def build(inputs: ReportInputs) -> Section:
    sec = Section("online", "Online fitting")
    traj, c = inputs.fit.trajectory, inputs.fit.coefficients
    if traj is None and inputs.summary is None:
        return sec.omit("needs trajectory.parquet in the fit directory or the traces")
    if traj is not None and traj.height:
        sec.add(*_trajectory_block(traj, c))
    else:
        sec.add("No trajectory.parquet in the fit directory: refit history not shown.")
    if inputs.summary is not None:
        sec.add(*_role_block(inputs))
    else:
        sec.add(f"The per-dataset role analysis needs the traces: {inputs.notes.get('traces', '')}.")
    return sec
