"""Budgeted verification (docs/budget.md): how many drafts the target verifies this step, and whose.

Glossary:
  confidence  c[r, j]  predicted P(draft j of request r is accepted | drafts before j were accepted)
  survival    s[r, j] = prod_{i<=j} c[r, i]: P(drafts 0..j of request r are all accepted). Verifying
              the first k drafts of r yields sum_{j<k} s[r, j] accepted drafts in expectation.
  budget      b: drafts verified this step, summed over the batch
  E(b)        N_s + (sum of the b largest survivals): expected tokens emitted by the step; every
              sampling request emits one target token (bonus or resample) even if all drafts fail
  cost(b)     fixed_ms + verify_ms[T + b]; fixed_ms = drafting (+ the target's KV reads) for n requests,
              T = non-draft target tokens already scheduled (1 per decoding request + prefill chunks)
  b*          argmax_b E(b) / cost(b), ties -> the smallest b

Because c <= 1, survival never grows with depth, so the b largest survivals of a request are a prefix
of its drafts: each request verifies its first num_verify[r] drafts. Slots compete across requests:
a confident request keeps position 5 while a doubtful one is cut after position 1.
Ties between equal survivals are broken by (request, position), as the Triton allocation kernel does.
Losslessness (docs/lossless.md) needs a causal rule: whether slot j of request r is verified may depend on
q_0..q_j of r (already fixed when x_j is drawn) but not on c[r, j+1..], which are functions of the drawn
x_j. Sizing b* from this step's survivals breaks that (b* moves with c[r, 1], so k_r >= 1 depends on
x_0). vLLM sizes b* from confidences one step old; `plan_verification` takes `sizing` confidences that
must not depend on this step's draws (adaptive.py uses each request's position-0 feature, which depends
on the prefix only) and then allocates the top-b* slots from the live survivals. With b* fixed the
allocation is causal: a request's deeper slots never outrank its shallower ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Allocation:
    """One step's verification plan."""

    num_verify: torch.Tensor  # [B] int64, verified prefix length per request
    budget: int  # b*, == num_verify.sum()
    survival: torch.Tensor  # [B, K] float, 0 on slots past num_drafted
    expected_tokens: float  # E(b*)
    cost_ms: float  # cost(b*)


def survival(confidences: torch.Tensor, num_drafted: torch.Tensor) -> torch.Tensor:
    """Cumulative acceptance probabilities; slots at j >= num_drafted[r] get 0.

    confidences: [B, K] in [0, 1]; num_drafted: [B] int64. Returns [B, K] (float32, or float64 for float64 input).

    >>> survival(torch.tensor([[0.5, 0.5, 1.0]]), torch.tensor([2])).tolist()
    [[0.5, 0.25, 0.0]]
    """
    k = confidences.shape[1]
    valid = torch.arange(k, device=confidences.device)[None, :] < num_drafted[:, None]  # [B, K]
    dtype = torch.promote_types(confidences.dtype, torch.float32)  # float32, float64 kept
    c = confidences.to(dtype).clamp(0.0, 1.0).masked_fill(~valid, 0.0)
    return c.cumprod(dim=1)  # [B, K]


def rank_slots(surv: torch.Tensor, num_drafted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid slots sorted by survival descending, ties by (request, position).

    Returns (values [M], flat indices [M]) with M = num_drafted.sum(); flat index = r * K + j.
    """
    k = surv.shape[1]
    valid = (torch.arange(k, device=surv.device)[None, :] < num_drafted[:, None]).reshape(-1)  # [B*K]
    flat = surv.reshape(-1).masked_fill(~valid, -1.0)  # invalid slots sort last
    values, order = torch.sort(flat, descending=True, stable=True)  # stable: ties keep (r, j) order
    m = int(valid.sum())
    return values[:m], order[:m]


def choose_budget(sorted_survival: torch.Tensor, num_sampling: int, fixed_ms: float,
                  verify_ms: torch.Tensor) -> int:
    """b* = argmax_b E(b) / cost(b) over b = 0..M, ties -> smallest b.

    sorted_survival: [M] descending; verify_ms: [M + 1], verify_ms[b] = verify cost of T + b tokens.
    """
    expected = torch.cat([sorted_survival.new_zeros(1), sorted_survival.double().cumsum(0)])  # [M+1]
    expected = expected + num_sampling  # E(b) = N_s + sum of the top-b survivals
    rate = expected / (fixed_ms + verify_ms.double())  # expected tokens per ms, [M+1]
    return int(torch.argmax(rate))  # torch.argmax returns the first maximum: ties -> smallest b


def allocate(order: torch.Tensor, budget: int, batch: int, k: int) -> torch.Tensor:
    """Per-request verify counts from the top-`budget` slots of `order` ([M] flat indices r * K + j).

    The top slots of one request are a prefix of its drafts (survival is non-increasing in j and ties
    are broken by position), so the count of a request's winners is its verified prefix length.
    """
    winners = order[:budget] // k  # [b] request of each winning slot
    return torch.bincount(winners, minlength=batch).to(torch.int64)  # [B]


def plan_verification(confidences: torch.Tensor, num_drafted: torch.Tensor, *, num_sampling: int,
                      num_scheduled: int, fixed_ms: float, verify_ms,
                      sizing: tuple[torch.Tensor, torch.Tensor] | None = None) -> Allocation:
    """Survival -> sort -> E(b)/cost(b) -> argmax budget -> per-request prefixes.

    confidences: [B, K]; num_drafted: [B] int64; verify_ms: callable mapping a [n] int64 numpy array
    of target token counts to [n] milliseconds (e.g. `CostTable.verify_cost`). `sizing`: optional
    (confidences [B, K], num_drafted [B]) that size b* instead of the live ones (see the module note on
    losslessness); the top-b* live slots are then verified (b* capped at the drafted slots).

    >>> flat = lambda t: t * 0.0 + 1.0   # verifying is free beyond a constant: verify everything
    >>> plan_verification(torch.ones(2, 3), torch.tensor([3, 2]), num_sampling=2, num_scheduled=2,
    ...                   fixed_ms=1.0, verify_ms=flat).num_verify.tolist()
    [3, 2]
    """
    batch, k = confidences.shape
    surv = survival(confidences, num_drafted)  # [B, K]
    values, order = rank_slots(surv, num_drafted)  # [M], [M]
    tokens = num_scheduled + torch.arange(values.numel() + 1)  # [M+1] target tokens for b = 0..M
    v_ms = torch.as_tensor(verify_ms(tokens.numpy()), dtype=torch.float64)  # [M+1]
    if sizing is None:
        b = choose_budget(values, num_sampling, fixed_ms, v_ms)
    else:
        s_values, _ = rank_slots(survival(*sizing), sizing[1])  # [M'] from draw-independent inputs
        s_tokens = num_scheduled + torch.arange(s_values.numel() + 1)
        s_ms = torch.as_tensor(verify_ms(s_tokens.numpy()), dtype=torch.float64)
        b = min(choose_budget(s_values, num_sampling, fixed_ms, s_ms), values.numel())
    num_verify = allocate(order, b, batch, k)
    expected = num_sampling + float(values[:b].double().sum())
    return Allocation(num_verify, b, surv, expected, fixed_ms + float(v_ms[b]))
