"""Hybrid Verified Decoding (docs/hvd.md): route each decode step to the suffix cache or the draft model.

Reading order: `suffix_cache` (the cache drafter) -> `replay` (trace replay: oracle accepted lengths
and features) -> `features`, `model_accept`, `token_classes`, `token_lookup` (what the replay
computes) -> `payoff_mlp` and `router` (predictor, routers) -> `path` (decode-path simulation,
metrics), `joint_budget` (the joint verification budget), `oracle` (the clairvoyant bound), `verdict`
(per dataset: best router vs best single drafter) -> `fit` (`fit_hvd`, the body of `avkit fit
--hvd`) -> `hybrid_drafter` (the live drafter; `substrings` keeps its copy features incremental).
"""

# The paper's figures (seed 003), quoted by `avkit hvd --markdown`, bench/hvd.py and the report.
PAPER = ("the HVD paper (Hybrid Verified Decoding: Learning to Allocate Verification in Speculative Decoding; "
         "seed 003, docs/seeds.md): high-payoff (accepted >= 6) precision 78.2-87.6%, recall 61.4-79.8%; cycles "
         "per 1,000 tokens 571 (EAGLE-3) -> 200 (HVD) on Llama-3.1-8B; 2.73x mean over EAGLE-3")
