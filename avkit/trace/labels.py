"""The label rule: which draft slots the target labelled (docs/estimator.md).

A step verifies the first `num_verify` drafts of a request and accepts a prefix of `num_accepted`
of them. Draft slot j is
  observed   verified and at or before the first rejection: j < num_verify and j <= num_accepted
             (the slot carries a label; later verified slots were never decided by the target)
  accepted   its label: j < num_accepted
Written once, elementwise, for numpy arrays and torch tensors alike: the rejection reference, the
trace writers (engine, vLLM, synthetic), the live estimator's refits and the HVD replay all call it.
The Triton kernel (kernels/rejection.py) stores the same expression and is tested against the
reference bit for bit.

>>> import numpy as np
>>> observed(np.arange(4), 3, 1).tolist()
[True, True, False, False]
"""

from __future__ import annotations


def observed(j, num_verify, num_accepted):
    """Whether slot `j` carries a label; broadcasts positions [K] against counts [B, 1] -> [B, K]."""
    return (j < num_verify) & (j <= num_accepted)


__all__ = ["observed"]
