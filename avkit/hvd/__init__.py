"""Hybrid Verified Decoding (docs/hvd.md): route each decode step to the suffix cache or the draft model.

Reading order: `suffix_cache` (the cache drafter) -> `replay` (trace replay: oracle accepted lengths,
the model's matches, synthetic generations) -> `features` (what the replay and the live drafter compute
per position; the token-class table) -> `payoff_mlp` and `router` (predictor, routers) -> `path`
(decode-path simulation, metrics), `joint` (the joint verification budget, live and replayed), `verdict`
(per dataset: best router vs best single drafter, and the clairvoyant bound) -> `fit` (`fit_hvd`, the body
of `avkit hvd` and `avkit fit --hvd`; `markdown` renders it) -> `hybrid_drafter` (the live drafter).
"""

# The paper's figures (seed 003), quoted by `avkit hvd --markdown`, bench/hvd.py and the report.
PAPER = ("the HVD paper (Hybrid Verified Decoding: Learning to Allocate Verification in Speculative Decoding; "
         "seed 003, docs/seeds.md): high-payoff (accepted >= 6) precision 78.2-87.6%, recall 61.4-79.8%; cycles "
         "per 1,000 tokens 571 (EAGLE-3) -> 200 (HVD) on Llama-3.1-8B; 2.73x mean over EAGLE-3")

# The router metrics of hvd_metrics.json (path.evaluate), in the order every router table shows them after
# `router` [, `dataset`]: `avkit hvd`, its Markdown (bench/results/hvd.md) and `avkit report`.
METRICS = ("cycles_per_1k", "mean_accepted", "cache_share", "precision", "recall")
SPEEDUPS = ("speedup_vs_model", "speedup_vs_suffix", "speedup_vs_target")  # throughput ratios
