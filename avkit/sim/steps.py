"""Recorded steps as arrays, and the continuous-batching schedule a concurrency replays them under.

Glossary:
  step row     one recorded (request, decode step): its K draft slots as one row of [S, K] arrays
  label        recorded outcome of a slot: 1 accepted, 0 rejected, -1 censored (not observed)
  lane         one of `concurrency` batch slots; a lane serves requests back to back
  copy         recorded requests are cycled so that every lane serves >= `waves` requests; copy i
               replays recorded request i mod R
  sim step     index of a simulated engine step; a step row of copy i runs at start[i] + its ordinal
  window       the sim steps in which every lane is busy (steady state); metrics use only these
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, fields, replace

import numpy as np
import polars as pl

from avkit.scheduling.cost import CostTable
from avkit.errors import ConfigError, DataError, TraceError
from avkit.jsonsafe import read_json
from avkit.step_types import StepTime
from avkit.trace.schema import generations_path

FEATURE_COLUMNS = ("logit_qmax", "q_max", "q_2nd", "entropy", "head_conf", "confidence")
NEEDED = ("run_id", "request_id", "step", "position", "num_drafted", "num_verified", "num_accepted",
          "accepted", "batch_size", "step_time_ms")


@dataclass(frozen=True)
class StepTable:
    request: np.ndarray  # [S] int64 recorded request index, rows sorted by (request, step)
    ordinal: np.ndarray  # [S] int64 step ordinal within its request (0, 1, ...)
    drafted: np.ndarray  # [S] int64 recorded num_drafted
    verified: np.ndarray  # [S] int64 recorded num_verified
    accepted: np.ndarray  # [S] int64 recorded num_accepted (accepted length)
    label: np.ndarray  # [S, K] int8: 1 accepted, 0 rejected, -1 censored
    features: dict  # name -> [S, K] float64 (NaN where the slot does not exist or the column is null)
    engine_step: np.ndarray  # [S] int64 recorded global engine step (-1 if absent), + file_index << 40
    batch_size: np.ndarray  # [S] int64 recorded batch size
    step_time_ms: np.ndarray  # [S] float64 recorded wall time of the engine step
    k: int  # recorded K (max drafted)

    @property
    def num_requests(self) -> int:
        return int(self.request.max()) + 1 if self.request.size else 0

    @property
    def steps_per_request(self) -> np.ndarray:  # [R]
        return np.bincount(self.request, minlength=self.num_requests)

    def take(self, rows: np.ndarray) -> StepTable:
        """The step rows `rows` ([S] bool mask or indices), in that order."""
        return replace(self, **{f.name: getattr(self, f.name)[rows] for f in fields(self) if f.name not in ("features", "k")},
                       features={name: v[rows] for name, v in self.features.items()})


def _model_rows(df: pl.DataFrame) -> pl.DataFrame:
    return df.filter(pl.col("drafter").cast(pl.Utf8) == "model") if "drafter" in df.columns else df


def _request_key(df: pl.DataFrame) -> pl.Expr:
    """One string per request: (file_index, run_id, request_id); its dense rank is the StepTable request index."""
    run = pl.col("file_index").cast(pl.Utf8) if "file_index" in df.columns else pl.lit("")
    return pl.concat_str([run, pl.col("run_id").cast(pl.Utf8), pl.col("request_id").cast(pl.Utf8)], separator="\x1f")


def request_ids(df: pl.DataFrame) -> pl.DataFrame:
    """[R] rows (file_index, run_id, request_id as strings) in `step_table(df)`'s request-index order."""
    df = _model_rows(df)
    cols = [pl.col(c).cast(pl.Utf8) for c in ("file_index", "run_id", "request_id") if c in df.columns]
    return df.select(_request_key(df).alias("_key"), *cols).unique("_key").sort("_key").drop("_key")


def step_table(df: pl.DataFrame, k: int | None = None) -> StepTable:
    """Pivot slot rows (trace format v1) into step rows, model-drafter rows only; `k`: the traces' K (None: inferred)."""
    missing = [c for c in NEEDED if c not in df.columns]
    if missing:
        raise TraceError(f"simulate: trace frame lacks column {missing[0]!r}")
    df = _model_rows(df)
    if df.height == 0:
        raise TraceError("simulate: the traces hold no model-drafter rows")
    df = df.with_columns((_request_key(df).rank("dense") - 1).cast(pl.Int64).alias("_req")).sort("_req", "step",
                                                                                                  "position")
    req, step = df["_req"].to_numpy(), df["step"].to_numpy()
    new = np.r_[True, (req[1:] != req[:-1]) | (step[1:] != step[:-1])]  # first slot row of each step row
    sid = np.cumsum(new) - 1  # [N] step row of each slot row
    first = np.flatnonzero(new)  # [S]
    pos = df["position"].to_numpy().astype(np.int64)
    # the traces' K, wide enough for every row (the reader refused rows past a file's K, or past
    # MAX_INFERRED_K without one: trace/values.py)
    k = max(k or 0, int(df["num_drafted"].max()), int(pos.max()) + 1)
    s = first.size

    def matrix(values: np.ndarray, fill, dtype) -> np.ndarray:
        m = np.full((s, k), fill, dtype=dtype)
        m[sid, pos] = values
        return m

    acc = df["accepted"].cast(pl.Int8).fill_null(-1).to_numpy()
    feats = {c: matrix(df[c].cast(pl.Float64).fill_null(np.nan).to_numpy(), np.nan, np.float64)
             for c in FEATURE_COLUMNS if c in df.columns and df[c].null_count() < df.height}
    r = req[first]
    starts = np.r_[0, np.flatnonzero(r[1:] != r[:-1]) + 1]  # first step row of each request
    ordinal = np.arange(s) - np.repeat(starts, np.diff(np.r_[starts, s]))
    col = lambda c: df[c].to_numpy()[first].astype(np.int64)
    eng = df["engine_step"].fill_null(-1).to_numpy()[first] if "engine_step" in df.columns else np.full(s, -1)
    if "file_index" in df.columns and (eng >= 0).all():  # engine steps count per file: keep files apart
        eng = df["file_index"].to_numpy()[first].astype(np.int64) * (1 << 40) + eng
    return StepTable(r.astype(np.int64), ordinal, col("num_drafted"), col("num_verified"), col("num_accepted"),
                     matrix(acc, -1, np.int8), feats, eng.astype(np.int64), col("batch_size"),
                     df["step_time_ms"].to_numpy()[first].astype(np.float64), k)


@dataclass(frozen=True)
class Schedule:
    """Step rows of one concurrency's replay, in sim-step order, cut to the steady-state window."""

    rows: np.ndarray  # [S'] index into the StepTable
    group: np.ndarray  # [S'] sim step (0 .. num_groups-1), non-decreasing
    num_groups: int
    concurrency: int
    copy: np.ndarray | None = None  # [S'] request copy of each row (its lane's request, see glossary)
    num_requests: np.ndarray | None = None  # [G] requests in each sim step (None: its rows)


def schedule(steps: StepTable, concurrency: int, waves: int) -> Schedule:
    """Continuous batching with `concurrency` lanes; a request takes its recorded number of steps."""
    lengths = steps.steps_per_request  # [R]
    n_copies = max(steps.num_requests, concurrency * waves)
    source = np.arange(n_copies) % steps.num_requests  # [C] recorded request of each copy
    start = np.empty(n_copies, dtype=np.int64)
    lanes = [(0, lane) for lane in range(concurrency)]  # (free at sim step, lane); loop is over requests
    for i in range(n_copies):
        free_at, lane = heapq.heappop(lanes)
        start[i] = free_at
        heapq.heappush(lanes, (free_at + int(lengths[source[i]]), lane))
    window = min(t for t, _ in lanes)  # first lane to run dry (every lane got >= `waves` requests)
    row_start = np.r_[0, np.cumsum(lengths)[:-1]]  # [R] first step row of each request
    n = lengths[source]  # [C] step rows per copy
    copy = np.repeat(np.arange(n_copies), n)  # [sum n]
    ordinal = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    rows, group = row_start[source[copy]] + ordinal, start[copy] + ordinal
    keep = group < window
    order = np.lexsort((copy[keep], group[keep]))
    return Schedule(rows[keep][order], group[keep][order], int(window), concurrency, copy[keep][order])


@dataclass(frozen=True)
class Replay:
    """One concurrency's schedule with the per-step quantities every policy needs."""

    steps: StepTable
    sched: Schedule
    cost: CostTable
    bounds: np.ndarray  # [G+1] first schedule row of each sim step
    num_requests: np.ndarray  # [G] int64 requests in each sim step (N_s = T = this: all decoding, no prefill)

    @classmethod
    def build(cls, steps: StepTable, sched: Schedule, cost: CostTable) -> Replay:
        bounds = np.searchsorted(sched.group, np.arange(sched.num_groups + 1))
        n = np.diff(bounds) if sched.num_requests is None else sched.num_requests
        return cls(steps, sched, cost, bounds, n.astype(np.int64))


# An aggregate acceptance profile (`avkit import vllm-metrics`) as step rows: it gives P(L > j) = survival_j,
# so P(L = l) = s_{l-1} - s_l (s_{-1} = 1, s_K = 0); `profile_steps` lays out `rows` step rows with exactly that
# distribution (largest-remainder counts, a fixed interleave), every draft K slots. No features: only no-spec
# and fixed K can be replayed (`policies_for_profile`).
def read_profile(path) -> dict:
    profile = read_json(path, "--profile", DataError)
    if not isinstance(profile, dict) or profile.get("kind") != "aggregate" or "positions" not in profile:
        raise DataError(f"--profile {path}: not an aggregate acceptance profile (`avkit import vllm-metrics`)")
    return profile


def length_distribution(profile: dict) -> np.ndarray:
    """[K + 1] P(L = l) from the profile's survival."""
    s = np.array([p["survival"] for p in profile["positions"]], dtype=np.float64)  # [K]
    if s.size == 0 or not np.isfinite(s).all() or (np.diff(np.r_[1.0, s]) > 1e-12).any() or (s < 0).any():
        raise DataError(f"acceptance profile: survival {s.tolist()} must be finite, in [0, 1] and non-increasing")
    return np.r_[1.0, s] - np.r_[s, 0.0]


def profile_steps(profile: dict, rows: int = 20_000, steps_per_request: int = 64) -> StepTable:
    """A StepTable whose accepted lengths follow the profile exactly (module docstring)."""
    pmf = length_distribution(profile)  # [K + 1]
    k = pmf.size - 1
    exact = pmf * rows
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(-(exact - counts), kind="stable")[: rows - counts.sum()]] += 1  # largest remainder
    lengths = np.repeat(np.arange(k + 1), counts)  # [S]
    order = np.argsort((np.arange(rows) * 0.6180339887498949) % 1.0, kind="stable")  # golden-ratio interleave
    accepted = lengths[order]
    j = np.arange(k)
    label = np.where(j[None, :] < accepted[:, None], 1, np.where(j[None, :] == accepted[:, None], 0, -1))
    request = np.arange(rows) // steps_per_request
    ordinal = np.arange(rows) % steps_per_request
    full = np.full(rows, k, dtype=np.int64)
    return StepTable(request.astype(np.int64), ordinal.astype(np.int64), full, full.copy(),
                     accepted.astype(np.int64), label.astype(np.int8), {}, np.full(rows, -1, np.int64),
                     np.ones(rows, np.int64), np.full(rows, np.nan), k)


def policies_for_profile(specs: list[str] | None) -> list[str]:
    """No-spec and fixed K only (an aggregate has no features to adapt on)."""
    specs = specs or ["nospec", "fixed"]
    bad = [s for s in specs if not (s == "nospec" or s.startswith("fixed"))]
    if bad:
        raise ConfigError(f"--policy {bad[0]}: an aggregate acceptance profile (--profile) has no per-draft "
                          "features; only nospec and fixed[:K] can be simulated from it")
    return specs


def trace_steps(path) -> list[StepTime]:
    """A recorded trace's engine steps that drafted and admitted no one, in order, as the engine timed them for the
    cost learner (scheduling/learn.py): requests, draft passes, target tokens, context (engine.py's count: each
    request's prompt, the tokens it emitted before the step by its generations table's token times, one time a
    step, and the drafts it accepts), the trace's step_time_ms. A step without drafts has no trace rows."""
    gens = (pl.read_parquet(generations_path(path))
            .select("request_id", pl.col("prompt_ids").list.len().alias("prompt"), "token_s").explode("token_s")
            .group_by("request_id", "token_s").agg(pl.col("prompt").first(), pl.len().alias("emitted")).sort("token_s")
            .select("request_id", step=pl.int_range(pl.len()).over("request_id").cast(pl.Int32),
                    before=pl.col("prompt") + pl.col("emitted").cum_sum().shift(1, fill_value=0).over("request_id")))
    rows = (pl.read_parquet(path).with_columns(pl.col("request_id").cast(pl.Utf8))
            .group_by("engine_step", "request_id")
            .agg(pl.col("step", "num_verified", "num_accepted", "step_time_ms").first(), pl.col("num_drafted").max())
            .join(gens, on=["request_id", "step"]))
    steps = (rows.group_by("engine_step")
             .agg(pl.len().alias("n"), pl.col("num_drafted").max(), (pl.col("num_verified") + 1).sum(),
                  (pl.col("before") + pl.col("num_accepted")).sum(), pl.col("step_time_ms").first(),
                  (pl.col("step") == 0).any().alias("admit"))
             .filter(~pl.col("admit")).sort("engine_step"))
    return [StepTime(*r) for r in steps.select("n", "num_drafted", "num_verified", "before", "step_time_ms").rows()]
