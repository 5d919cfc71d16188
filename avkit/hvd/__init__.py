"""Hybrid Verified Decoding (docs/hvd.md): route each decode step to the suffix cache or the draft model.

Reading order: `avkit.hvd.suffix_cache` (the cache drafter) -> `avkit.hvd.replay` (trace
replay: oracle accepted lengths and features) -> `features`, `model_accept`, `token_classes` (what the
replay computes) -> `avkit.hvd.payoff_mlp` and `avkit.hvd.router` (predictor, routers) ->
`path` (decode-path simulation, metrics) -> `fit` (`fit_hvd`, the body of `avkit fit --hvd`) ->
`avkit.hvd.hybrid_drafter` (the live drafter).
"""
