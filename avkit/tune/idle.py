"""The cost of speculation configured but off (K = 0 in a range), per concurrency c (no-spec step t_c, mean
prompt P and output L tokens per request):
  drafter sync      fed every decoded token: draft_ms(c) per step, a share draft_ms(c) / t_c
  catch-up          fed after a pause of p steps: c prefill_ms(p), as a share of the pause
  drafter prefill   every admitted prompt: a share c prefill_ms(P) / (L t_c), paid whether or not it drafts
`overhead_share` = prefill + the cheaper of sync and a 64-step catch-up: at most what the table shows (a
table without a profiled prefill prices it as a draft pass over as many rows, an upper bound). NOT_PRICED
lists what neither the table nor the traces show.
"""

from __future__ import annotations

from avkit.scheduling.cost import CostTable

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

