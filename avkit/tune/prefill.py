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

from avkit.errors import ConfigError, first_line
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
    """[R] prompt tokens of each request of `step_table(rows)` from the generations tables beside the traces (None:
    a trace has none). A request without a generations row (unfinished when its recording stopped) takes its
    dataset's mean prompt (else the mean of all); `warn` gets one line with their count."""
    parts = []
    for index, path in enumerate(paths):
        gen = generations_path(path)
        if not Path(gen).is_file():
            return None
        try:
            df = pl.read_parquet(gen, columns=["run_id", "request_id", "prompt_ids"])
        except (OSError, pl.exceptions.PolarsError) as e:
            raise ConfigError(f"{gen}: cannot read run_id/request_id/prompt_ids ({first_line(e)})") from None
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


# Speculation configured but off (K = 0 in a range), per concurrency c (no-spec step t_c, mean prompt P and
# output L tokens per request):
#   drafter sync      fed every decoded token: draft_ms(c) per step, a share draft_ms(c) / t_c
#   catch-up          fed after a pause of p steps: c prefill_ms(p), as a share of the pause
#   drafter prefill   every admitted prompt: a share c prefill_ms(P) / (L t_c), paid whether or not it drafts
# `overhead_share` = prefill + the cheaper of sync and a 64-step catch-up: at most what the table shows (a table
# without a profiled prefill prices it as a draft pass over as many rows, an upper bound). NOT_PRICED lists what
# neither the table nor the traces show.
PAUSES = (8, 64, 512)  # steps off before speculation resumes, for the catch-up prices
NOT_PRICED = ("per-step speculative bookkeeping with nothing drafted (scheduler metadata, sampler launches, "
              "draft-token placeholders)",
              "CUDA-graph mode: vLLM V1 falls back to piecewise graphs with a per-batch-size schedule",
              "the drafter's KV memory (counted in the feasibility check, not in time)")


def idle_costs(cost: CostTable, concurrency: int, nospec_step_ms: float, prompt_tokens: float,
               output_tokens: float) -> dict:
    """Prices of being on but idle at one concurrency (module note); shares are of no-spec time."""
    c, t = float(concurrency), float(nospec_step_ms)
    sync = float(cost.draft_pass_cost(c))
    catch = {p: c * float(cost.draft_prefill_cost(p)) for p in PAUSES}
    prefill = float(cost.draft_prefill_cost(max(prompt_tokens, 1.0)))
    prefill_share = c * prefill / (max(output_tokens, 1.0) * t)
    return {"concurrency": concurrency, "nospec_step_ms": t,
            "sync_ms_per_step": sync, "sync_share": sync / t,
            "catch_up_ms": {str(p): ms for p, ms in catch.items()},
            "catch_up_share": {str(p): ms / (p * t) for p, ms in catch.items()},
            "prefill_ms_per_request": prefill, "prefill_share": prefill_share,
            # the prefill it cannot avoid plus the cheaper way to keep the drafter ready (upper bound, module note)
            "overhead_share": prefill_share + min(sync / t, catch[64] / (64 * t))}
