"""`avkit tune`: which K at which batch size, and is adaptive verification worth it.

Reading order: feasibility.py (what fits the KV cache), arms.py (the deployments compared, replayed by
avkit/sim/, and the bootstrap over recorded requests), schedule.py (best arm per concurrency, batch-size
ranges), prefill.py (the drafter's prompt prefill; speculation configured but off), acceptance.py (the
acceptance profile), context.py (K per context band), formats.py (the document compiled into every engine's
settings), run.py (`tune`, the whole result as one JSON-ready dict).

The result (`avkit tune --out`, default reports/tune.json), key by key:
  traces, requests, trace_k, max_k   inputs: trace files, recorded requests, recorded K, largest K tried
  cost                               the cost table's meta (+ spec, drafter kind)
  config                             concurrency, tpot_slo_ms, estimator, draft_gate, waves, bootstrap, level, seed
  context                            tokens per request for the KV check and where they came from
  memory                             the KV budget (feasibility.py) or null when the table does not know it
  infeasible                         [{concurrency, kv_tokens_needed, kv_tokens_available}]: not simulated
  concurrency                        the feasible concurrencies, simulated
  cells                              one per arm x concurrency: throughput_tok_s [lo, hi], per_request_tok_s,
                                     p90_tpot_ms, meets_slo, tokens_per_step, step_ms, drafts_wasted, vs_nospec
  slo                                {tpot_ms, unmet: concurrencies where no arm meets it}
  schedule                           ranges [[lo, hi, K]], trtllm_ranges, adaptive (bool), per_concurrency [{concurrency, k,
                                     arm, fixed_arm, throughput_tok_s, meets_slo, vs_single_k, vs_nospec,
                                     adaptive_vs_fixed, stop_vs_recommended: {ratio, lo, hi}}], single_k,
                                     geomean gains
  idle                               prefill.py prices per K = 0 concurrency, what is not priced, request lengths
  schedule.context_ranges, context_changes, bands
                                     with --context-bands only (context.py): the schedule per context band
                                     and the concurrencies whose K changes with context
  profile                            the acceptance profile (acceptance.py): the pair, per-position acceptance
                                     with intervals per dataset and temperature, the fitted coefficients
  vllm, vllm_context, vllm_synthetic, trtllm, sglang
                                     each engine's payload, exactly what `--format` prints (formats.py; null:
                                     speculation off); schedule.trtllm_ranges: what TensorRT-LLM runs (K
                                     clamped to the first range's)
With `cost` (the cost model it was tuned on) and `inputs` (provenance) the document is the one acceptance
profile file that every engine format is compiled from.
  notes                              caveats that apply to this result
"""

from avkit.tune.run import tune

__all__ = ["tune"]
