"""Hybrid Verified Decoding (docs/hvd.md): route each decode step to the suffix cache or the draft model.

Reading order: `suffix_cache` (the cache drafter) -> `replay` (trace replay: oracle accepted lengths
and features) -> `features`, `model_accept`, `token_classes`, `token_lookup` (what the replay
computes) -> `payoff_mlp` and `router` (predictor, routers) -> `path` (decode-path simulation,
metrics), `joint_budget` (the joint verification budget), `oracle` (the clairvoyant bound), `verdict`
(per dataset: best router vs best single drafter) -> `fit` (`fit_hvd`, the body of `avkit fit
--hvd`) -> `hybrid_drafter` (the live drafter; `substrings` keeps its copy features incremental).
"""
