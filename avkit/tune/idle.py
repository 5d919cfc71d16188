"""The cost of speculation that is configured but off (K = 0 at some load): what can and cannot be priced.

A schedule that turns speculation off in a batch-size range still runs a speculative engine there. From
the cost table and the traces, per concurrency c of such a range (no-spec step time t_c, mean prompt P
and output L tokens per request):
  drafter sync      the drafter fed every decoded token as it happens, to stay ready:
                    draft_ms(c) per step, a share draft_ms(c) / t_c of the step time
  catch-up          or it is fed later, when speculation resumes after a pause of p steps: a prefill of
                    the p tokens each of the c requests missed, c * prefill_ms(p); as a share of the pause
  drafter prefill   every admitted prompt is prefilled by the drafter too (prefill_ms(P)); c requests are
                    admitted per L steps at steady state, a share c * prefill_ms(P) / (L * t_c) of the time,
                    paid whether or not the range drafts
The sync price is exact on the table (a draft pass over c requests is what it measures). prefill_ms is
the table's profiled drafter prefill (scheduling/cost.py); a table without one prices a prefill of n
tokens as a draft pass over n rows, an upper bound (roofline: context_len tokens of KV per row), so both
are reported as "at most". The engine's catch-up rule (scheduling/catch_up.py) uses the same price to
decide which requests draft again after a K = 0 range. `overhead_share` = prefill + the
cheaper of sync and a 64-step catch-up: at most what the table shows for being on but idle.
What neither the cost table nor the traces show (not priced, stated in every output): the engine's
per-step speculative bookkeeping with nothing drafted (scheduler metadata, rejection-sampler launch,
draft-token placeholders); CUDA-graph differences (vLLM V1 with a per-batch-size schedule replays
piecewise instead of full graphs); the drafter's KV memory (priced in the feasibility check instead).
Users report +6.6% TPOT at c2 and 15-18% for speculation switched off at run time from these sources.
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

