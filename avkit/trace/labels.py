"""The label rule (docs/estimator.md): a step verifies the first `num_verify` drafts of a request and accepts a
prefix of `num_accepted` of them; draft slot j is observed (carries a label) iff j < num_verify and
j <= num_accepted, and its label is j < num_accepted. Written once, elementwise for numpy and torch alike, for
the rejection reference, the trace writers, the live refits and the HVD replay; the Triton kernel
(kernels/rejection.py) stores the same expression, tested against the reference bit for bit.

>>> import numpy as np
>>> observed(np.arange(4), 3, 1).tolist()
[True, True, False, False]
"""

from __future__ import annotations


def observed(j, num_verify, num_accepted):
    """Whether slot `j` carries a label; broadcasts positions [K] against counts [B, 1] -> [B, K]."""
    return (j < num_verify) & (j <= num_accepted)


__all__ = ["observed"]
