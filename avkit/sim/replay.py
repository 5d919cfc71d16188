"""Trace-replay simulation: verify policies x concurrency against a cost table.

Per concurrency c, recorded requests run in c lanes of a continuous batch (steps.py); each sim step costs
what the policy drafted plus cost.step_cost(n, 0, n + verified), and a request verifying k of a recorded
step's drafts emits min(k, a) + 1 tokens (a: the recorded accepted length). What that ignores:
  * divergence: after accepting fewer drafts than recorded the real sequence would continue differently;
    the replay keeps the recorded steps, so every request takes its recorded number of steps and the batch
    composition is the same under every policy
  * slots the recording did not verify: a request never accepts more than recorded
  * prefill and admission (N_s = T = n); metrics use the steady-state window (every lane busy)
RESULT_COLUMNS documents the metrics.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from avkit.config import SimulateConfig
from avkit.errors import TraceError
from avkit.estimators.base import ESTIMATORS
from avkit.jsonsafe import json_safe
from avkit.provenance import INPUTS_KEY, cost_record, inputs_record
from avkit.scheduling.cost import CostTable
from avkit.sim.drive import SimPolicy, decide, parse_policies
from avkit.sim.steps import Replay, StepTable, schedule, step_table
from avkit.staged import StagedOutputs
from avkit.trace.reader import common_k, read_traces

# The results table (one row per concurrency x policy), as written to Parquet and read by `avkit report`.
RESULT_COLUMNS = {
    "concurrency": "requests decoding at once (lanes)",
    "policy": "the policy spec's label (scheduling/spec.py): nospec, fixedK, adaptive[-stop][-nogate]-ESTIMATOR "
              "(ESTIMATOR also oracle, recorded), schedule-FILESTEM, full",
    "estimator": "confidence source of adaptive policies ('' otherwise)",
    "lossless": "False when decisions depend on the drawn tokens (the oracle, lossy features): not deployable",
    "draft_len": "drafts proposed per request and step at most",
    "drafted_per_step": "mean drafts proposed per request-step",
    "throughput_tok_s": "tokens emitted per second over the steady-state window",
    "per_request_tok_s": "throughput / concurrency (interactivity)",
    "mean_accepted": "mean accepted drafts per request-step, min(k, recorded accepted)",
    "tokens_per_step": "mean tokens per request-step (accepted + 1)",
    "verified_per_step": "mean drafts verified per engine step (batch total)",
    "step_ms": "mean predicted engine step time, ms",
    "drafts_wasted": "share of proposed drafts not accepted (rejected, after a rejection, or trimmed)",
    "sim_steps": "engine steps in the steady-state window",
    "vs_best_fixed": "throughput / best fixed K at this concurrency",
    "vs_nospec": "throughput / no speculation at this concurrency",
}


def load_steps(traces) -> StepTable:
    """StepTable from a StepTable, a polars frame of trace rows, or trace paths (read and validated)."""
    if isinstance(traces, StepTable):
        return traces
    if isinstance(traces, pl.DataFrame):
        return step_table(traces)
    paths = [traces] if isinstance(traces, (str, Path)) else list(traces)
    return step_table(read_traces(paths), common_k(paths)[0])


def default_policies(steps: StepTable, config: SimulateConfig) -> list[str]:
    specs = ["nospec", "fixed"] + [f"adaptive:{e}" for e in config.estimators if e in ESTIMATORS]
    specs += [f"adaptive-stop:{e}" for e in config.estimators[:1] if e in ESTIMATORS]
    if "confidence" in steps.features:
        specs.append("adaptive:recorded")
    return specs + (["adaptive:oracle"] if config.oracle else [])


def deployable(df: pl.DataFrame) -> np.ndarray:
    """[N] bool, the results rows of policies one could deploy: the `lossless` column where present (the oracle and
    lossy features are not), else every policy but the oracle (a table written before the column)."""
    if "lossless" in df.columns:
        return df["lossless"].fill_null(True).to_numpy().astype(bool)
    return ~df["policy"].str.contains("oracle").to_numpy()


def accepted_drafts(replay: Replay, k_verify: np.ndarray) -> np.ndarray:
    """[S'] accepted drafts of each request-step verifying k_verify [S'] of its recorded drafts: min(k, a)."""
    return np.minimum(k_verify, replay.steps.accepted[replay.sched.rows])


def step_times(replay: Replay, k_verify: np.ndarray, draft_ms: np.ndarray) -> np.ndarray:
    """[G] predicted ms of each sim step from a policy's verify counts [S'] and drafting ms [G]."""
    n = replay.num_requests  # [G]
    verified = np.add.reduceat(k_verify, replay.bounds[:-1])  # [G]
    return draft_ms + replay.cost.step_cost(n, 0, n + verified)  # the drafting the policy ran, then the step


def policy_metrics(replay: Replay, policy: SimPolicy, k_verify: np.ndarray, drafted: np.ndarray,
                   draft_ms: np.ndarray) -> dict:
    """Replay one policy's verify counts [S'], drafts [S'] and drafting ms [G] through the cost table."""
    steps, rows, bounds = replay.steps, replay.sched.rows, replay.bounds
    assert (k_verify <= drafted).all(), "a policy verified more drafts than it drafted"
    accepted = accepted_drafts(replay, k_verify)  # [S']
    n = replay.num_requests  # [G]
    verified = np.add.reduceat(k_verify, bounds[:-1])  # [G]
    step_ms = step_times(replay, k_verify, draft_ms)  # [G]
    tokens = accepted.sum() + rows.size  # + 1 bonus / resampled token per request-step
    throughput = 1e3 * tokens / step_ms.sum()
    return {
        "concurrency": replay.sched.concurrency, "policy": policy.name, "estimator": policy.estimator,
        "lossless": policy.lossless,
        "draft_len": policy.draft_len(steps.k), "drafted_per_step": float(drafted.mean()),
        "throughput_tok_s": throughput, "per_request_tok_s": throughput / replay.sched.concurrency,
        "mean_accepted": float(accepted.mean()), "tokens_per_step": float(accepted.mean() + 1.0),
        "verified_per_step": float(verified.mean()), "step_ms": float(step_ms.mean()),
        "drafts_wasted": float(1.0 - accepted.sum() / drafted.sum()) if drafted.sum() else 0.0,
        "sim_steps": int(n.size),
    }


def simulate(traces, cost: CostTable, concurrency=None, policies=None, *, config: SimulateConfig | None = None,
             coefficients: str = "", progress=None) -> pl.DataFrame:
    """Replay `traces` under each policy spec (None: `default_policies`) at each concurrency; one result row per
    pair (RESULT_COLUMNS)."""
    steps = load_steps(traces)
    config = config or SimulateConfig()
    concurrency = tuple(concurrency or config.concurrency)
    chosen = parse_policies(policies or default_policies(steps, config), steps.k, coefficients, config.burn_in)
    chosen = [p.prepare(steps) for p in chosen]
    rows = []
    for c in concurrency:
        replay = Replay.build(steps, schedule(steps, c, config.waves), cost)
        for policy in chosen:
            rows.append(policy_metrics(replay, policy, *decide(policy.make(steps, cost), replay)))
            if progress is not None:
                progress()
    df = pl.DataFrame(rows)
    best_fixed = (df.filter(pl.col("policy").str.starts_with("fixed")).group_by("concurrency")
                  .agg(pl.col("throughput_tok_s").max().alias("_best")))
    nospec = df.filter(pl.col("policy") == "nospec").select("concurrency", pl.col("throughput_tok_s").alias("_ns"))
    df = df.join(best_fixed, on="concurrency", how="left").join(nospec, on="concurrency", how="left")
    return df.with_columns((pl.col("throughput_tok_s") / pl.col("_best")).alias("vs_best_fixed"),
                           (pl.col("throughput_tok_s") / pl.col("_ns")).alias("vs_nospec")).drop("_best", "_ns")


def results_inputs(paths, cost: CostTable, config: SimulateConfig, policies, command: str = "avkit simulate") -> dict:
    """The provenance record of a results file: traces (hashed), cost model, policies, concurrency."""
    return inputs_record(command, paths, cost=cost_record(cost, config.cost), policies=list(policies),
                         concurrency=list(config.concurrency), waves=config.waves)


def simulate_and_write(paths, cost: CostTable, config: SimulateConfig, out, outputs: StagedOutputs | None = None, *,
                       steps: StepTable | None = None, policies=None, command: str = "avkit simulate",
                       progress=None) -> tuple[pl.DataFrame, Path]:
    """`avkit simulate`'s run (also `avkit report`'s "simulated now"): replay `paths` (or their `steps`) under
    `policies` (None: `default_policies`) at config.concurrency, and write the results with their provenance
    (`results_inputs`, recorded as `command`) to `out`."""
    steps = load_steps(paths) if steps is None else steps
    specs = policies or default_policies(steps, config)
    df = simulate(steps, cost, config.concurrency, specs, config=config, coefficients=config.coefficients,
                  progress=progress)
    return df, write_results(df, out, outputs, inputs=results_inputs(paths, cost, config, specs, command))


def read_inputs(path) -> dict | None:
    """The provenance record of a results file (None when it predates them)."""
    raw = (pq.read_metadata(path).metadata or {}).get(INPUTS_KEY.encode())
    return json.loads(raw) if raw else None


def step_time_check(traces, cost: CostTable) -> dict:
    """Predicted vs recorded step time over the recorded engine steps (needs `engine_step`), also over
    decode-only steps (a step that admitted a request holds its prefill, which a decode cost table does not price)."""
    steps = load_steps(traces)
    if (steps.engine_step < 0).any():
        raise TraceError("step-time check needs the engine_step column")
    eng, first = np.unique(steps.engine_step, return_index=True)
    idx = np.searchsorted(eng, steps.engine_step)  # [S] engine step of each step row
    verified = np.bincount(idx, weights=steps.verified)
    passes = np.zeros(eng.size)
    np.maximum.at(passes, idx, steps.drafted)
    admits = np.bincount(idx, weights=steps.ordinal == 0, minlength=eng.size) > 0  # [E] prefill inside
    n = steps.batch_size[first].astype(np.float64)
    predicted = cost.step_cost(n, passes, n + verified)
    recorded = steps.step_time_ms[first]

    def summary(m: np.ndarray) -> dict:
        rel = predicted[m] / recorded[m] - 1.0
        ok = bool(m.any())
        return {"engine_steps": int(m.sum()),
                "median_abs_rel_error": float(np.median(np.abs(rel))) if ok else float("nan"),
                "median_ratio": float(np.median(predicted[m] / recorded[m])) if ok else float("nan"),
                "mean_recorded_ms": float(recorded[m].mean()) if ok else float("nan"),
                "mean_predicted_ms": float(predicted[m].mean()) if ok else float("nan")}

    return {**summary(np.ones(eng.size, bool)), "decode_only": summary(~admits)}


def write_results(df: pl.DataFrame, path, outputs: StagedOutputs | None = None, *,
                  inputs: dict | None = None) -> Path:
    """Parquet through a staged output (`outputs`, committed by the caller; else committed here).
    `inputs`: the provenance record (avkit/provenance.py), stored as the file's `avkit.inputs` metadata."""
    table = df.to_arrow()
    if inputs is not None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               INPUTS_KEY: json.dumps(json_safe(inputs))})
    with StagedOutputs() if outputs is None else nullcontext(outputs) as out:
        pq.write_table(table, out.file(path), compression="zstd")
    return Path(path).expanduser()
