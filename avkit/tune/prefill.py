"""The drafter's prompt prefill, charged to the arms that draft, and the cap on new tokens (`avkit tune`).

A speculative engine's drafter prefills every admitted prompt before that request can draft (avkit's draft
model, vLLM's draft_model proposer), and the batch waits for that forward. The simulator replays decode
steps only, so the tuner adds it per recorded request r:
  P_r          prompt tokens (the generations table beside the trace, joined on run_id and request_id)
  L_r          r's output tokens: accepted + 1 per recorded step (after the cap below): the workload's
               length, whatever the arm
  price_r      prefill_ms(P_r), the cost table's drafter prefill curve (where the table has none, a draft
               pass over P_r rows: an upper bound, scheduling/cost.py)
  per token    price_r / L_r: batch ms per output token of r, the prompt's prefill spread over the tokens
               the request will emit
In an arm that drafts (fixed K, adaptive) every token emitted for r pays price_r / L_r on top of the
decode steps; no-spec pays nothing. Per token, not per replayed step: the simulator replays a request's
recorded steps, so an arm drafting fewer than the recorded K emits fewer tokens per copy than L_r,
while a real request emits its L_r tokens in more steps and pays its prefill once over them. A cell's throughput is then tokens / (decode ms + drafter prefill ms); the
decode-only rate stays in the cell (`decode_tok_s`): the catch-up rule (scheduling/catch_up.py) prices the
prefill itself, so its saving per token is decode-only. Short outputs make the prefill dearer per token:
a cap of 64 new tokens doubles it against the shipped traces' ~126.
Not priced here: the target's own prefill (every arm pays it alike: it lowers every rate, not their
order), and the stall a newcomer's prefill puts on the others' time per output token (p90 TPOT stays
decode-only).

--max-new-tokens N: the workload as if every request were capped at N new tokens: each recorded request
keeps its steps up to the one that emits its N-th token (tune with the cap the engine serves with).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl

from avkit.errors import ConfigError
from avkit.scheduling.cost import CostTable
from avkit.sim.steps import StepTable, request_ids
from avkit.trace.schema import generations_path

JOIN = ["file_index", "run_id", "request_id"]


def output_tokens(steps: StepTable) -> np.ndarray:
    """[R] tokens each recorded request emits: accepted + 1 per step."""
    return np.bincount(steps.request, weights=steps.accepted + 1, minlength=steps.num_requests)


def cap_new_tokens(steps: StepTable, n: int) -> StepTable:
    """The steps of each request up to the one that emits its n-th new token (n = 0: all of them)."""
    if n <= 0:
        return steps
    emitted = steps.accepted + 1  # [S]
    total = np.cumsum(emitted)  # [S] running over all rows; rows are grouped by request
    start = np.r_[0, np.flatnonzero(np.diff(steps.request)) + 1]  # [R] first row of each request
    before = total - emitted - np.repeat(total[start] - emitted[start], np.diff(np.r_[start, steps.request.size]))
    keep = before < n  # [S] tokens the request emitted before this step are under the cap
    if keep.all():
        return steps
    return replace(steps, request=steps.request[keep], ordinal=steps.ordinal[keep], drafted=steps.drafted[keep],
                   verified=steps.verified[keep], accepted=steps.accepted[keep], label=steps.label[keep],
                   features={name: v[keep] for name, v in steps.features.items()},
                   engine_step=steps.engine_step[keep], batch_size=steps.batch_size[keep],
                   step_time_ms=steps.step_time_ms[keep])


def prompt_tokens(paths: list[str], rows: pl.DataFrame, warn=None) -> np.ndarray | None:
    """[R] prompt tokens of each request of `step_table(rows)` from the generations tables beside the trace
    files (`rows` from read_traces(paths), with file_index); None when a trace has no generations table.

    A request without a generations row (still running when its recording was stopped: its slot rows stay in
    the trace, traces/README.md) is priced at the mean prompt of its dataset's requests that have one (the
    mean of all of them when none does); `warn` gets one line with their count."""
    parts = []
    for index, path in enumerate(paths):
        gen = generations_path(path)
        if not Path(gen).is_file():
            return None
        try:
            df = pl.read_parquet(gen, columns=["run_id", "request_id", "prompt_ids"])
        except (OSError, pl.exceptions.PolarsError) as e:
            raise ConfigError(f"{gen}: cannot read run_id/request_id/prompt_ids ({str(e).splitlines()[0]})") from None
        parts.append(df.select(pl.lit(str(index)).alias("file_index"), pl.col("run_id").cast(pl.Utf8),
                               pl.col("request_id").cast(pl.Utf8), pl.col("prompt_ids").list.len().alias("prompt")))
    ids = request_ids(rows)
    joined = ids.join(pl.concat(parts).unique(JOIN, keep="first"), on=JOIN, how="left", maintain_order="left")
    missing = joined["prompt"].null_count()
    if missing:
        datasets = rows.select(*(pl.col(c).cast(pl.Utf8) for c in [*JOIN, "dataset"])).unique(JOIN)
        joined = joined.join(datasets, on=JOIN, how="left", maintain_order="left").with_columns(
            pl.col("prompt").fill_null(pl.col("prompt").mean().over("dataset")).fill_null(pl.col("prompt").mean()))
        if warn is not None:
            warn(f"{missing} of {joined.height} requests have no generations row (unfinished when their recording "
                 "stopped): their drafter prefill is priced at their dataset's mean prompt length")
    return joined["prompt"].to_numpy().astype(np.float64)


def prefill_per_token(steps: StepTable, prompt: np.ndarray | None, cost: CostTable) -> np.ndarray | None:
    """[R] ms of drafter prefill per output token of each recorded request (module note); None: not priced."""
    if prompt is None:
        return None
    return cost.draft_prefill_cost(np.maximum(prompt, 1.0)) / np.maximum(output_tokens(steps), 1.0)


__all__ = ["cap_new_tokens", "output_tokens", "prefill_per_token", "prompt_tokens"]
