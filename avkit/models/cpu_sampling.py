"""The CPU backend's passes over vocabulary rows (``cpu_sampling.cpp``): the sampling distribution and the
inputs of the draft features, a few reads of each row instead of a dozen full-width torch operations.

One signature with the torch reference each replaces, which stays the definition:

- ``sampled_probs(logits, temperature, top_p)`` == runtime/sampling.py ``_sampled_probs(logits, t, tp)``
  (no top-k / min-p): softmax(logits / T), the top-p nucleus cut, renormalised. The nucleus rule is
  ``top_p_threshold``'s, evaluated exactly (the same ladder of top-k prefixes, the same float rounding of
  the running sums): on the same probabilities the kernel's ``nucleus_threshold`` returns its thresholds
  bit for bit.
  The softmax itself differs from torch's by float rounding (an exp within ~2 ulp, another summation
  order): tests/test_cpu_sampling.py states the tolerances.
- ``row_stats(logits, temperature)`` -> [N, 4] (m, m2, s_o, sum_others e (x/T - m)), the four reductions
  avkit/features.py ``draft_features`` computes its features from.

Used on CPU tensors where the kernel loads (native.py); elsewhere, and on CUDA, the torch code runs unchanged.
"""

from __future__ import annotations

import torch

from avkit.models import native


def usable(logits: torch.Tensor) -> bool:
    """Whether these [N, V] logits (CPU, float32 or bf16) can take the native passes here."""
    return logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.bfloat16) \
        and native.load("sampling") is not None


def sampled_probs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits [N, V] float32 or bf16, temperature [N] (> 0), top_p [N] -> [N, V] float32 probabilities."""
    return native.load("sampling").sampled_probs(logits.contiguous(), temperature.float().contiguous(),
                                                 top_p.float().contiguous())


def row_stats(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits [N, V] float32 or bf16, temperature [N] (> 0) -> [N, 4] float32 (m, m2, s_o, sum_others e (x/T - m))
    of x / T: its largest and second-largest values, and over the others (all but one argmax) the sums of
    e = exp(x / T - m) and of e (x / T - m)."""
    return native.load("sampling").row_stats(logits.contiguous(), temperature.float().contiguous())
