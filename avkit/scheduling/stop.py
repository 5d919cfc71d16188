"""Early stop of an autoregressive drafter (docs/budget.md): after each draft pass, which rows draft one more.

An autoregressive drafter pays one forward per depth, which trimming cannot refund, so the policy
also decides how deep to draft. After pass j (rows that drafted in it are `active`), with the plan
sized over everything drafted so far and the drafting already paid:
  rate      E(b*) / cost(b*): the step's tokens per ms at the current optimum          [G]
  marginal  pass_ms / n_active + verify_ms[T + b* + 1] - verify_ms[T + b*]: one more draft of
            one request (its share of the next pass, its extra verified token)        [G]
  s_next    s_newest * c_newest: the next draft's survival, its confidence guessed as the newest one's
  keep      active & (the plan verifies every draft so far) & s_next > rate * marginal
Causal (confidences of drafted slots only) and lossless (q's shape and the load decide, never a
drawn token's probability). The live policy (`AdaptiveVerification.continue_drafting`, one group)
and the simulator (`adaptive-stop`, one group per step) both call `continue_drafting`.
"""

from __future__ import annotations

import torch

from avkit.scheduling.plan import Plan, plan


def continue_drafting(conf: torch.Tensor, proposed: torch.Tensor, active: torch.Tensor, group: torch.Tensor,
                      num_groups: int, *, num_sampling: torch.Tensor, num_scheduled: torch.Tensor,
                      fixed_ms: torch.Tensor, pass_ms: torch.Tensor, n_active: torch.Tensor,
                      verify_ms: torch.Tensor) -> tuple[torch.Tensor, Plan]:
    """[S] bool "draft one more" after a pass, and the plan it was judged on.

    conf: [S, j] confidences of the drafts so far; proposed: [S] drafts so far; active: [S] bool, drafted
    in this pass; group [S] ascending; num_sampling, num_scheduled, fixed_ms (drafting paid so far + KV
    reads), pass_ms (this pass), n_active: [G]; verify_ms: [T_max + 1] lookup (plan.verify_lookup).
    """
    p = plan(conf, proposed, group, num_groups, num_sampling=num_sampling, num_scheduled=num_scheduled,
             fixed_ms=fixed_ms, verify_ms=verify_ms)
    rate = p.expected / p.cost_ms  # [G] tokens per ms at the optimum
    t = num_scheduled + p.budget  # [G] target tokens verified at the optimum
    marginal = pass_ms.double() / n_active.clamp(min=1) + verify_ms[t + 1] - verify_ms[t]  # [G]
    rows = torch.arange(conf.shape[0], device=conf.device)
    newest = (proposed - 1).clamp(min=0)  # [S]
    c_newest = torch.nan_to_num(conf[rows, newest], nan=0.0).clamp(0.0, 1.0)
    s_next = p.survival[rows, newest] * c_newest  # [S] guess of the next draft's survival
    keep = active & (p.num_verify == proposed) & (s_next > (rate * marginal)[group])
    return keep, p


__all__ = ["continue_drafting"]
