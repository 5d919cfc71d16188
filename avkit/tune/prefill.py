"""The drafter's prompt prefill, charged to the arms that draft, and the cap on new tokens (`avkit tune`).

The simulator replays decode steps only; a speculative engine's drafter also prefills every admitted
prompt while the batch waits. Per recorded request r (P_r prompt tokens from the generations table, L_r
output tokens, accepted + 1 per step after the cap) every token an arm that drafts emits pays
cost.draft_prefill_cost(P_r) / L_r ms; no-spec pays nothing. Not priced: the target's own prefill (alike
for every arm) and the stall a newcomer's prefill puts on the others' TPOT.
--max-new-tokens N: each request keeps its steps up to the one that emits its N-th token.
"""

from __future__ import annotations

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
    return steps.take(keep)


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
