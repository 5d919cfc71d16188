"""The CPU backend's passes over vocabulary rows (``cpu_sampling.cpp``, docs/runtime.md), each with the signature
of the torch code it replaces where the kernel loads, which stays the definition:

- ``sampled_probs(logits, temperature, top_p)`` == runtime/sampling.py ``_sampled_probs`` without top-k / min-p:
  the nucleus thresholds bit for bit (``top_p_threshold``'s ladder and float rounding), the softmax within
  float rounding (tests/test_cpu_sampling.py states the tolerances);
- ``row_stats(logits, temperature)``: the four reductions avkit/features.py ``draft_features`` starts from.
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
