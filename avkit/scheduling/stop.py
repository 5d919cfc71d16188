"""Early stop of an autoregressive drafter (docs/budget.md): after each draft pass, which rows draft on.

An autoregressive drafter pays one forward per depth, which trimming cannot refund, so the policy
also decides how deep to draft. After pass j (rows that drafted in it are `active`), with the plan
sized over everything drafted so far and the drafting already paid:
  rate      E(b*) / cost(b*): the step's tokens per ms at the current optimum                  [G]
  pending   the row's drafts so far that b* leaves unverified (u of them, survivals summed)    [S]
  c_next    the newest draft's confidence, the guess for every deeper one (clamped to [0, 1])  [S]
  gain(m)   pending + s_newest (c_next + ... + c_next^m): expected tokens of drafting m more and
            verifying the row to the end                                                     [S, D]
  cost(m)   m pass_ms / n_active + verify_ms[T + b* + u + m] - verify_ms[T + b*]: the row's share
            of m more passes and its u + m extra verified tokens                             [S, D]
  keep      active & exists m in 1..K - proposed with gain(m) > rate * cost(m)
Look-ahead over D = K depths, not one (docs/budget.md "Early stop": the CPU kernel's 6-row tiles make
depth d + 1 alone unprofitable where d + 2 pays). Lossless: drafted slots' confidences and the load decide.
"""

from __future__ import annotations

import torch

from avkit.scheduling.plan import Plan, plan


def continue_drafting(conf: torch.Tensor, proposed: torch.Tensor, active: torch.Tensor, group: torch.Tensor,
                      num_groups: int, *, num_sampling: torch.Tensor, num_scheduled: torch.Tensor,
                      fixed_ms: torch.Tensor, pass_ms: torch.Tensor, n_active: torch.Tensor,
                      verify_ms: torch.Tensor, max_drafts: int) -> tuple[torch.Tensor, Plan]:
    """[S] bool "draft on" after a pass, and the plan it was judged on.

    conf: [S, j] confidences of the drafts so far; proposed: [S] drafts so far; active: [S] bool, drafted
    in this pass; group [S] ascending; num_sampling, num_scheduled, fixed_ms (drafting paid so far + KV
    reads), pass_ms (this pass), n_active: [G]; verify_ms: [T_max + 1] lookup (plan.verify_lookup);
    max_drafts: K, the deepest a row may draft (the look-ahead's horizon).
    """
    p = plan(conf, proposed, group, num_groups, num_sampling=num_sampling, num_scheduled=num_scheduled,
             fixed_ms=fixed_ms, verify_ms=verify_ms)
    rate = p.expected / p.cost_ms  # [G] tokens per ms at the optimum
    t = num_scheduled + p.budget  # [G] target tokens verified at the optimum
    rows = torch.arange(conf.shape[0], device=conf.device)
    newest = (proposed - 1).clamp(min=0)  # [S]
    c_next = torch.nan_to_num(conf[rows, newest].double(), nan=0.0).clamp(0.0, 1.0)  # [S]
    surv = p.survival.double()  # [S, j]
    j = torch.arange(surv.shape[1], device=conf.device)[None, :]
    unverified = (j >= p.num_verify[:, None]) & (j < proposed[:, None])  # [S, j]
    pending = (surv * unverified).sum(1)  # [S]
    u = proposed - p.num_verify  # [S]
    m = torch.arange(1, max(max_drafts, 1) + 1, device=conf.device)  # [D] more drafts
    gain = pending[:, None] + surv[rows, newest][:, None] * (c_next[:, None] ** m).cumsum(1)  # [S, D]
    top = verify_ms.numel() - 1
    t_row = t[group]  # [S]
    extra = verify_ms[(t_row[:, None] + u[:, None] + m).clamp(max=top)] - verify_ms[t_row][:, None]  # [S, D]
    cost = m * (pass_ms.double() / n_active.clamp(min=1))[group][:, None] + extra  # [S, D]
    pays = (gain > rate[group][:, None] * cost) & (m <= max_drafts - proposed[:, None])  # [S, D]
    return active & pays.any(1), p


__all__ = ["continue_drafting"]
