"""GPU hot paths of the runtime, each a Triton kernel beside its torch reference (the spec).

  confidence     draft logits -> logit(q_max), q_max, q_2nd, entropy, sigma(slope*f + intercept)
  rejection      speculative verification with variable verify lengths (rejection_ref.py)
  irls_stats     per-position sums a, b, c, g0, g1, n for the online estimator's refit
  allocation     survival products and per-request verify counts under a slot budget
  rng            counter-based uniform(seed, request, position, stream, index); the kernels hash alike
Pick a backend once with `avkit.kernels.dispatch.select_kernels(device)`. Modules named *_ref
are pure torch; the others import triton.
"""
