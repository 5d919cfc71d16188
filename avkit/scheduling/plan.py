"""The verification plan (docs/budget.md): how many drafts the target verifies, and whose, for many
steps at once. The ONE implementation: the live policy calls it with one group (its step), the
simulator with thousands (one group per simulated step, torch CPU tensors), the draft gate and the
HVD joint budget with their own rows. Torch only, no host synchronisation: every output stays on
the inputs' device.

Glossary (per group g = one step; rows r are its requests, slots j < num_drafted[r] their drafts):
  confidence  c[r, j]  predicted P(draft j of r is accepted | drafts before j were accepted)
  survival    s[r, j] = prod_{i<=j} c[r, i], taken left to right in the input's float type (the
              Triton survival kernel's order, so both give the same bits); 0 past num_drafted
  rank        the group's valid slots sorted by (s desc, row, position): ties go to the earlier
              request, then the shallower draft, as the Triton allocation kernel breaks them
  E(b)        N_s + sum of the top-b survivals: expected tokens of the step (every sampling request
              emits one target token even if all its drafts fail)
  cost(b)     fixed_ms + verify_ms[T + b]; fixed_ms = drafting + the target's KV reads, T = non-draft
              target tokens already scheduled
  b*          argmax_b E(b) / cost(b) over b = 0..M_g, ties -> the smallest b
  num_verify  row r verifies its slots ranked < b*: because c <= 1 survival never grows with depth,
              so they are a prefix of r's drafts
`sizing` (other confidences and drafts) sizes b* instead of the allocated ones; the top-b* allocated
slots are then verified, b* capped at the group's slots. Losslessness needs it (adaptive.py): b* must
not move with this step's draws. `verify_ms` is a lookup table [T_max + 1] of ms by target tokens
(`verify_lookup`), so the rule needs no callback into numpy and runs on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Plan:
    """The plan of G groups over S rows."""

    num_verify: torch.Tensor  # [S] int64, verified prefix length per row
    budget: torch.Tensor  # [G] int64, b*_g (capped at the group's allocated slots)
    expected: torch.Tensor  # [G] float64, E(b*_g) on the slots that sized b* (the verified ones without `sizing`)
    cost_ms: torch.Tensor  # [G] float64, cost(b*_g)
    survival: torch.Tensor  # [S, K], of the allocated confidences


@dataclass(frozen=True)
class Ranked:
    """Every slot [M = S K] in plan order: by (group, valid first, survival desc, row, position)."""

    row: torch.Tensor  # [M] int64
    pos: torch.Tensor  # [M] int64
    group: torch.Tensor  # [M] int64
    valid: torch.Tensor  # [M] bool, j < num_drafted (a group's invalid slots rank after its valid ones)
    value: torch.Tensor  # [M] survival (0 at invalid slots)
    rank: torch.Tensor  # [M] int64, 0-based rank within its group
    top: torch.Tensor  # [M] float64, sum of its group's survivals ranked at or before it
    slots: torch.Tensor  # [G] int64, valid slots per group
    paid: torch.Tensor | None = None  # [M] float64, sum of its group's slot_ms ranked at or before it (plan's slot_ms)


def survival(confidences: torch.Tensor, num_drafted: torch.Tensor) -> torch.Tensor:
    """[S, K] confidences (NaN read as 0, clamped to [0, 1]), [S] drafts -> [S, K] survival, 0 past num_drafted.

    float32 and float64 inputs keep their type; the product runs left to right, as the kernel's does.

    >>> survival(torch.tensor([[0.5, 0.5, 1.0]]), torch.tensor([2])).tolist()
    [[0.5, 0.25, 0.0]]
    """
    dtype = torch.promote_types(confidences.dtype, torch.float32)
    c = torch.nan_to_num(confidences.to(dtype), nan=0.0).clamp(0.0, 1.0)  # [S, K]
    if dtype == torch.float64 or c.shape[1] < 2:  # torch's CPU scan accumulates float64 in float64, in order
        s = c.cumprod(1) if c.device.type == "cpu" else _chain(c)
    else:  # float32: its scan accumulates in float64 and rounds once; the kernel multiplies in float32
        s = _chain(c)
    valid = torch.arange(s.shape[1], device=s.device)[None, :] < num_drafted[:, None]  # [S, K]
    return s.masked_fill(~valid, 0.0)


def _chain(c: torch.Tensor) -> torch.Tensor:
    """[S, K] left-to-right products in c's own float type: s_j = s_{j-1} * c_j."""
    ct = c.t()  # [K, S]
    s = [ct[0]]
    for j in range(1, ct.shape[0]):  # over positions (K <= 64), vectorized over rows
        s.append(s[-1] * ct[j])
    return torch.stack(s, 1)


def order_slots(key: torch.Tensor) -> torch.Tensor:
    """The ranking rule: slots by value descending, ties in slot order (row-major: row, then position), along the
    last dim of `key` ([M], or [G, M] for G groups of equal size)."""
    return torch.sort(key, dim=-1, descending=True, stable=True).indices


def rank_slots(surv: torch.Tensor, num_drafted: torch.Tensor, group: torch.Tensor, num_groups: int,
               slot_ms: torch.Tensor | None = None) -> Ranked:
    """Rank every group's slots (module note; `group` [S] ascending): all S K slots, invalid ones last, no host read.
    slot_ms: optional [S, K] ms a slot adds to the step's cost when verified (summed as `paid`)."""
    k = surv.shape[1]
    dev = surv.device
    valid = (torch.arange(k, device=dev)[None, :] < num_drafted[:, None]).reshape(-1)  # [M] row-major
    key = surv.reshape(-1).masked_fill(~valid, -1.0)  # invalid slots below every survival
    order = order_slots(key)  # ties keep (row, position)
    if num_groups > 1:  # then by group, the survival order kept within each
        order = order[torch.sort(group.repeat_interleave(k)[order], stable=True).indices]
    row, pos = order // k, order % k
    ok = valid[order]
    value = key[order].clamp(min=0.0)  # [M] 0 at invalid slots: they add nothing to a running sum
    cost = None if slot_ms is None else slot_ms.reshape(-1)[order].double().masked_fill(~ok, 0.0)  # [M]
    rank = torch.arange(order.numel(), device=dev)  # [M] rank in the whole order
    if num_groups == 1:  # the live step and the gate: nothing to restart
        g = torch.zeros_like(row)
        return Ranked(row, pos, g, ok, value, rank, value.double().cumsum(0), num_drafted.clamp(0, k).sum().reshape(1),
                      None if cost is None else cost.cumsum(0))
    g = group[row]
    size = torch.zeros(num_groups, dtype=torch.int64, device=dev).index_add_(0, group, torch.ones_like(group))
    first = torch.cumsum(size * k, 0) - size * k  # [G] index of each group's first slot

    def running(x: torch.Tensor) -> torch.Tensor:  # [M] sum of x over its group's slots ranked at or before each
        csum = x.cumsum(0)  # one running sum, restarted per group
        return csum - torch.cat([csum - x, csum.new_zeros(1)])[first][g]  # (+ a pad: a group may start at M)

    slots = torch.zeros_like(size).index_add_(0, group, num_drafted.clamp(0, k))  # [G]
    return Ranked(row, pos, g, ok, value, rank - first[g], running(value.double()), slots,
                  None if cost is None else running(cost))


def best_budget(ranked: Ranked, num_sampling: torch.Tensor, num_scheduled: torch.Tensor, fixed_ms: torch.Tensor,
                verify_ms: torch.Tensor) -> torch.Tensor:
    """[G] b*_g = argmax_b E(b) / cost(b), ties -> smallest b; inputs [G], verify_ms table [T_max + 1]."""
    n_s, fixed = num_sampling.double(), fixed_ms.double()
    g = ranked.group
    rate0 = n_s / (fixed + verify_ms[num_scheduled])  # [G] b = 0: target-only
    b = ranked.rank + 1  # [M] the budget if this slot is the last one verified
    tokens = (num_scheduled[g] + b).clamp(max=verify_ms.numel() - 1)  # [M] (invalid slots may pass the table)
    rate = (n_s[g] + ranked.top) / (fixed[g] + verify_ms[tokens] + (0.0 if ranked.paid is None else ranked.paid))
    rate = rate.masked_fill(~ranked.valid, float("-inf"))  # only valid slots can be verified
    best = rate0.scatter_reduce(0, g, rate, "amax")  # [G] includes b = 0
    big = torch.iinfo(torch.int64).max
    first = torch.full_like(num_scheduled, big).scatter_reduce(0, g, torch.where(rate == best[g], b, big), "amin")
    return torch.where(rate0 >= best, 0, first)  # [G]


def expected_tokens(ranked: Ranked, budget: torch.Tensor, num_sampling: torch.Tensor) -> torch.Tensor:
    """[G] float64 E(b_g) = N_s + the top-b_g survivals of each group (b_g <= its valid slots)."""
    return up_to_budget(ranked, budget, ranked.top, num_sampling.double())


def up_to_budget(ranked: Ranked, budget: torch.Tensor, running: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """[G] start + a running sum ([M], restarted per group) read at each group's last verified slot."""
    at = ranked.rank + 1 == budget[ranked.group]  # [M] the last verified slot of each group
    return start.index_add(0, ranked.group, running.masked_fill(~at, 0.0))


def prefixes(ranked: Ranked, budget: torch.Tensor, rows: int) -> torch.Tensor:
    """[rows] int64: how many of each row's slots rank below its group's budget (a prefix of its drafts)."""
    won = (ranked.rank < budget[ranked.group]) & ranked.valid  # [M]
    return torch.zeros(rows, dtype=torch.int64, device=won.device).index_add_(0, ranked.row, won.long())


def plan(confidences: torch.Tensor, num_drafted: torch.Tensor, group: torch.Tensor, num_groups: int, *,
         num_sampling: torch.Tensor, num_scheduled: torch.Tensor, fixed_ms: torch.Tensor,
         verify_ms: torch.Tensor, sizing: tuple[torch.Tensor, torch.Tensor] | None = None,
         allocate=None, surv: torch.Tensor | None = None, slot_ms: torch.Tensor | None = None) -> Plan:
    """Survival -> rank -> b* -> per-row prefixes for rows [S] in `num_groups` groups.

    confidences: [S, K]; num_drafted, group: [S] int64 (group ascending); num_sampling, num_scheduled
    (int64), fixed_ms: [G]; verify_ms: [T_max + 1] float64 lookup (T_max >= num_scheduled + the group's drafts);
    sizing: optional (confidences [S, K'], num_drafted [S]) that size b*. allocate: the kernel set's
    `allocate(confidences, num_drafted, budget)` (one group): the prefixes by the allocation kernel
    (kernels/allocation.py on the device, allocation_ref.py = this module's ranking on CPU). surv: survivals
    already known ([S, K], non-increasing along K, e.g. HVD's survival heads) instead of the confidences'.
    slot_ms: [S, K] float64 ms each slot adds to cost(b) when verified (the early stop's guessed drafts'
    drafting; without `sizing` or `allocate`).

    >>> one = torch.zeros(2, dtype=torch.int64)
    >>> plan(torch.ones(2, 3), torch.tensor([3, 2]), one, 1, num_sampling=torch.tensor([2]),
    ...      num_scheduled=torch.tensor([2]), fixed_ms=torch.tensor([1.0]),
    ...      verify_ms=torch.ones(8, dtype=torch.float64)).num_verify.tolist()
    [3, 2]
    """
    if allocate is None:
        surv = survival(confidences, num_drafted) if surv is None else surv  # [S, K]
        live = rank_slots(surv, num_drafted, group, num_groups, slot_ms)
        sized = live if sizing is None else rank_slots(survival(*sizing), sizing[1], group, num_groups)
    else:  # the kernel ranks the allocated slots itself
        live, size_by = None, sizing if sizing is not None else (confidences, num_drafted)
        sized = rank_slots(survival(*size_by), size_by[1], group, num_groups)
    slots = torch.zeros_like(num_scheduled).index_add(0, group, num_drafted.clamp(0, confidences.shape[1]))  # [G]
    budget = torch.minimum(best_budget(sized, num_sampling, num_scheduled, fixed_ms, verify_ms), slots)  # [G]
    if live is not None:
        num_verify = prefixes(live, budget, confidences.shape[0])  # [S]
    else:
        alloc = allocate(confidences, num_drafted, budget, check=False)  # kernels' Allocation: survival, num_verify
        num_verify, surv = alloc.num_verify, alloc.survival
    cost_ms = fixed_ms.double() + verify_ms[num_scheduled + budget]
    if slot_ms is not None:
        cost_ms = up_to_budget(sized, budget, sized.paid, cost_ms)
    return Plan(num_verify, budget, expected_tokens(sized, budget, num_sampling), cost_ms, surv)


def verify_lookup(verify_cost, max_tokens: int, device=None) -> torch.Tensor:
    """[max_tokens + 1] float64 ms of verifying 0..max_tokens target tokens: a cost curve as a table
    (`CostTable.verify_cost` or any numpy-array function), built once on the host, kept on `device`."""
    ms = verify_cost(np.arange(max_tokens + 1))
    return torch.as_tensor(np.asarray(ms, dtype=np.float64).reshape(-1), device=device)


def single_group(rows: int, device=None) -> torch.Tensor:
    """[rows] zeros: every row in one group (the live step)."""
    return torch.zeros(rows, dtype=torch.int64, device=device)


# ---- early stop of an autoregressive drafter (docs/budget.md "Early stop"): after each draft pass, which rows
# draft on. After pass j (rows that drafted in it are `active`; each has drafted j), the step is priced as it
# stands and as it would stand after m = 1..D more passes of every active row (D = K - j), each plan at its optimum:
#   now       E(b*) / cost(b*) over the drafts so far, the drafting paid so far in fixed_ms        [G]
#   c_next    s_d^(1/d): the geometric mean of the row's d drafts' confidences (clamped to [0, 1]), the
#             per-draft rate of its survival so far                                                  [S]
#   after(m)  the same with each active row's next m drafts guessed at c_next; m passes cost m (pass_ms -
#             row_ms n_active) plus row_ms for each guessed draft the plan verifies: a pass costs by the
#             rows in it                                                                             [G, D]
#   m*        the smallest m of the best after(m)
#   keep      active & after(m*) > now & the plan at m* verifies at least one of the row's guessed drafts
# The group is priced whole, not row by row: verify cost is a staircase in the step's tokens (the CPU kernel's
# 6-row tiles), so no row alone pays for the next tile where all rows together do; and over D depths, not one
# (depth d + 1 alone may not pay where d + 2 does). Lossless: drafted slots' confidences and the load decide.


def continue_drafting(conf: torch.Tensor, proposed: torch.Tensor, active: torch.Tensor, group: torch.Tensor,
                      num_groups: int, *, num_sampling: torch.Tensor, num_scheduled: torch.Tensor,
                      fixed_ms: torch.Tensor, pass_ms: torch.Tensor, verify_ms: torch.Tensor, max_drafts: int,
                      row_ms: torch.Tensor | None = None) -> tuple[torch.Tensor, Plan]:
    """[S] bool "draft on" after a pass, and the plan of the drafts so far.

    conf: [S, j] confidences of the drafts so far; proposed: [S] drafts so far; active: [S] bool, drafted
    in this pass (proposed == j); group [S] ascending; num_sampling, num_scheduled, fixed_ms (drafting paid
    so far + KV reads), pass_ms (one more pass over the active rows), row_ms (what one row adds to that
    pass; None: 0): [G]; verify_ms: [T_max + 1] lookup (plan.verify_lookup, T_max >= num_scheduled +
    S max_drafts); max_drafts: K, the deepest a row may draft.
    """
    inputs = {"num_sampling": num_sampling, "num_scheduled": num_scheduled, "verify_ms": verify_ms}
    p = plan(conf, proposed, group, num_groups, fixed_ms=fixed_ms, **inputs)
    (s, j), dev = conf.shape, conf.device
    d = max_drafts - j  # D more passes at most
    if d <= 0 or s == 0:
        return torch.zeros_like(active), p
    now = p.expected / p.cost_ms  # [G]
    rows, m = torch.arange(s, device=dev), torch.arange(1, d + 1, device=dev)  # [S], [D]
    drafted_so_far = torch.arange(j, device=dev)[None, :] < proposed[:, None]  # [S, j]
    c = torch.nan_to_num(conf.double(), nan=0.0).clamp(0.0, 1.0).masked_fill(~drafted_so_far, 1.0)  # [S, j]
    c_next = c.prod(1) ** (1.0 / proposed.clamp(min=1).double())  # [S] s_d^(1/d)
    guessed = torch.cat([conf.double(), c_next[:, None].expand(s, d)], 1)  # [S, j + D]
    # one plan over G D groups: group g after m more passes is g D + m - 1, its rows ascending as plan needs
    ids = (group[None, :] * d + (m - 1)[:, None]).reshape(-1)  # [D S]
    order = torch.sort(ids, stable=True).indices
    src, more = rows.repeat(d)[order], m.repeat_interleave(s)[order]  # [D S] source row, its m
    drafted = proposed[src] + active[src].long() * more  # [D S]
    rep = lambda v: v.repeat_interleave(d)  # [G] -> [G D]
    row_ms = torch.zeros_like(pass_ms, dtype=torch.float64) if row_ms is None else row_ms.double()
    n_active = torch.zeros_like(num_sampling).index_add_(0, group, active.long())  # [G]
    base = (pass_ms.double() - row_ms * n_active).clamp(min=0.0)  # [G] a pass's ms that no row adds
    after_fixed = rep(fixed_ms.double()) + m.double().repeat(num_groups) * rep(base)  # [G D]
    guess_ms = (torch.arange(j + d, device=dev)[None, :] >= j) * row_ms[group][:, None]  # [S, j + D]
    q = plan(guessed[src], drafted, ids[order], num_groups * d, fixed_ms=after_fixed, slot_ms=guess_ms[src],
             **{k: rep(v) for k, v in inputs.items() if k != "verify_ms"}, verify_ms=verify_ms)
    after = (q.expected / q.cost_ms).reshape(num_groups, d)  # [G, D]
    best = after.max(1).values  # [G]
    first = torch.where(after == best[:, None], m[None, :], d + 1).min(1).values  # [G] m*
    verified = torch.empty_like(q.num_verify).index_put_((order,), q.num_verify).reshape(d, s)  # [D, S] unsorted
    at = verified.gather(0, (first[group] - 1).clamp(max=d - 1)[None, :])[0]  # [S] each row's prefix at m*
    return active & (best > now)[group] & (at > proposed), p  # no host read: indices, no masks
