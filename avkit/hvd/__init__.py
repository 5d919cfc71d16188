"""Hybrid Verified Decoding (docs/hvd.md): route each decode step to the suffix cache or the draft model.

Reading order: `avkit.drafters.suffix_cache` (the cache drafter) -> `avkit.sim.hvd_replay` (trace
replay: oracle accepted lengths and features) -> `features`, `model_accept`, `token_classes` (what the
replay computes) -> `avkit.estimators.payoff_mlp` and `avkit.drafters.router` (predictor, routers) ->
`path` (decode-path simulation, metrics) -> `fit` (`fit_hvd`, the body of `avkit fit --hvd`) ->
`avkit.drafters.hybrid` (the live drafter).
"""
