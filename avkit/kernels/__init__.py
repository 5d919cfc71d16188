"""The step's device hot paths, each a Triton kernel (`<name>.py`) beside its torch reference, the spec and CPU
path (`<name>_ref.py`): confidence, rejection, irls_stats, allocation; `rng` the random numbers both hash alike.
`dispatch.select_kernels(device)` picks a backend once (docs/runtime.md "Kernels").
"""
