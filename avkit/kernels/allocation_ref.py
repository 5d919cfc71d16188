"""Survival and budgeted allocation, torch reference: the spec and CPU path of `allocate_triton`.

Budgeted verification (docs/budget.md): with confidences c [B, K] in [0, 1], slot j of request r survives with
s[r, j] = prod_{i <= j} c[r, i] (slots j >= num_drafted[r] are invalid). Of a budget of b slots, the b valid
slots with the largest survival are verified, ties by (request, position) ascending: deterministic, and since
survival never grows with depth each request gets a prefix, num_verify[r]: scheduling/plan.py's survival and
ranking, with b given instead of chosen.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from avkit.errors import DataError
from avkit.scheduling.plan import prefixes, rank_slots, single_group, survival


class Allocation(NamedTuple):
    survival: torch.Tensor  # [B, K] float32, 0 at invalid slots
    num_verify: torch.Tensor  # [B] int64, verified prefix length per request


def allocation_inputs(confidences, num_drafted, budget, check: bool = True):
    """Check shapes (and values on CPU unless check=False) -> c [B, K] fp32, num_drafted [B] int64, budget [1]."""
    c = torch.as_tensor(confidences)
    if c.dim() != 2:
        raise DataError(f"confidences must be [B, K], got shape {tuple(c.shape)}")
    nd = torch.as_tensor(num_drafted, device=c.device).to(torch.int64)
    if tuple(nd.shape) != (c.shape[0],):
        raise DataError(f"num_drafted must have shape [{c.shape[0]}], got {tuple(nd.shape)}")
    b = torch.as_tensor(budget, device=c.device).to(torch.int64).reshape(-1)
    if b.numel() != 1:
        raise DataError(f"budget must be one integer, got shape {tuple(b.shape)}")
    c = c.float()
    if check and c.device.type == "cpu":  # on a GPU these checks would cost a sync per step
        if c.numel() and not bool(((c >= 0) & (c <= 1)).all()):
            raise DataError(f"confidences must be in [0, 1], got {c[~((c >= 0) & (c <= 1))][0].item()}")
        if bool(((nd < 0) | (nd > c.shape[1])).any()):
            raise DataError(f"num_drafted must be in [0, {c.shape[1]}], got {nd.tolist()[:8]}")
        if int(b) < 0:
            raise DataError(f"budget must be >= 0, got {int(b)}")
    return c.contiguous(), nd.contiguous(), b


@torch.no_grad()
def allocate_ref(confidences, num_drafted, budget, *, check: bool = True) -> Allocation:
    """Survival of every slot and each request's verified prefix under a budget of b slots.

    Examples
    --------
    >>> a = allocate_ref(torch.tensor([[0.9, 0.9], [0.5, 0.9]]), torch.tensor([2, 2]), 3)
    >>> a.num_verify.tolist()
    [2, 1]
    """
    c, nd, b = allocation_inputs(confidences, num_drafted, budget, check)
    s = survival(c, nd)  # [B, K]
    ranked = rank_slots(s, nd, single_group(c.shape[0], c.device), 1)  # ties: request, then position
    return Allocation(s, prefixes(ranked, b, c.shape[0]))  # the top-b slots
