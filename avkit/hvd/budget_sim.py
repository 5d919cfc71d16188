"""Cache and model drafts competing for one verification budget at a given concurrency
(HVD + Adaptive Verification, docs/budget.md, docs/hvd.md; going beyond the HVD paper).

Glossary:
  batch         `concurrency` replayed requests decoding in lockstep (the next waiting request takes a
                finished one's place)
  candidate     per request and step, the drafter it uses (`Route.use_cache`) and that draft's survival
                curve S_j = P(accepted >= j), j = 1..len (cache: the payoff MLP's survival head; model:
                a table keyed by recent model hit rate)
  budget        b draft slots over the whole batch: E(b) = N + sum of the top-b survivals,
                cost(b) = draft + 1 + c_v * (N + b), where draft = c_d * K when any request drafted
                with the model; b* = argmax E(b) / cost(b) (ties: smallest b). Survival is
                non-increasing in j, so each request verifies a prefix; a confident cache draft keeps
                slot 5 while a doubtful model draft is cut after 1
  full          the same batch verifying every drafted slot (the threshold router's behaviour)
Step cost is in target forwards; throughput = tokens / cost.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from avkit.config import HvdCostConfig
from avkit.hvd.path import Route
from avkit.scheduling.plan import Plan, plan_survival, single_group


def budget_plan(surv: np.ndarray, n_req: int, fixed_cost: float, c_v: float) -> Plan:
    """[N, K] survivals (0 = no slot) -> scheduling/plan.py's plan of one step, costs in target forwards:
    cost(b) = fixed_cost + 1 + c_v * (N + b). Host survivals, so the plan runs on the host (named
    explicitly: the live drafter makes every other tensor on its inputs' device)."""
    cpu = torch.device("cpu")
    s = torch.as_tensor(np.ascontiguousarray(surv, dtype=np.float64), device=cpu)
    n, k = s.shape
    verify = 1.0 + c_v * torch.arange(n_req + n * k + 1, dtype=torch.float64, device=cpu)  # [T+1] forward + tokens
    one = lambda v: torch.tensor([v], device=cpu)
    return plan_survival(s, (s > 0).sum(1), single_group(n, cpu), 1, num_sampling=one(n_req),
                         num_scheduled=one(n_req), fixed_ms=one(float(fixed_cost)), verify_ms=verify)


def budget_allocation(surv: np.ndarray, n_req: int, fixed_cost: float, c_v: float) -> np.ndarray:
    """[N, K] survivals (0 = no slot) -> [N] verified prefix lengths maximizing E(b) / cost(b)."""
    return budget_plan(surv, n_req, fixed_cost, c_v).num_verify.numpy()


def joint_step(cs: np.ndarray, ms: np.ndarray, cost: HvdCostConfig, k: int) -> tuple[np.ndarray, np.ndarray]:
    """One step of joint routing + budget for n requests with cache / model survivals [n, K].

    Two options: (a) the draft model runs (its cost is shared by the whole batch), each request takes
    the draft with the larger expected accepted length; (b) it does not, every request verifies its
    cache draft or nothing. Each option's slots compete for one budget; the better E/cost wins.
    Returns use_cache [n] bool and verified prefix lengths [n]."""
    n = len(cs)
    best = None
    for model_runs in (True, False):
        use = (cs.sum(1) >= ms.sum(1)) if model_runs else np.ones(n, dtype=bool)
        if model_runs and use.all():
            continue  # nobody wants the model: option (b)
        fixed = (cost.draft_step_cost * k if model_runs else 0.0) + cost.cache_cost
        p = budget_plan(np.where(use[:, None], cs, ms), n, fixed, cost.verify_token_cost)
        ratio = float(p.expected[0] / p.cost_ms[0])
        if best is None or ratio > best[0]:
            best = (ratio, use, p.num_verify.numpy())
    return best[1], best[2]


def simulate_batched(table: pl.DataFrame, route: Route, cost: HvdCostConfig, k: int, concurrency: int,
                     survivals: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, float]:
    """Decode the table's requests `concurrency` at a time. With `survivals` = (cache [R, K], model
    [R, K]) the drafters and slots are chosen jointly per step (`joint_step`, `route` unused);
    without, `route` decides and every drafted slot is verified."""
    rid = table["request_id"].to_numpy()
    starts = np.flatnonzero(np.r_[True, rid[1:] != rid[:-1]])
    lengths = np.diff(np.r_[starts, len(rid)])
    cache_acc, model_acc = table["cache_acc"].to_numpy(), table["model_acc"].to_numpy()
    dlen = table["draft_len"].to_numpy()
    j = np.arange(1, k + 1)[None, :]
    queue, live = list(range(len(starts)))[::-1], []
    pos = np.zeros(len(starts), dtype=np.int64)
    spent, steps, cache_steps = 0.0, 0, 0.0
    while queue or live:
        live = [g for g in live if pos[g] < lengths[g]]
        while queue and len(live) < concurrency:
            live.append(queue.pop())
        if not live:
            break
        g = np.array(live)
        r = starts[g] + pos[g]  # [n] replay rows
        if survivals is None:
            uc = route.use_cache[r]
            verify = np.where(uc, np.minimum(route.verify_len[r], dlen[r]), k)
        else:
            cs = survivals[0][r] * (j <= dlen[r][:, None])  # [n, K] zero beyond each cache draft
            uc, verify = joint_step(cs, survivals[1][r], cost, k)
        draft_cost = cost.draft_step_cost * k if (~uc).any() else 0.0
        lookup = cost.cache_cost if survivals is not None or route.consults_cache else 0.0
        acc = np.minimum(np.where(uc, cache_acc[r], model_acc[r]), verify)
        spent += draft_cost + lookup + 1 + cost.verify_token_cost * (len(g) + verify.sum())
        steps += 1
        cache_steps += uc.mean()
        pos[g] += acc + 1
    tokens = int(lengths.sum())
    return {"concurrency": concurrency, "steps": steps, "tokens": tokens, "throughput": tokens / spent,
            "cache_share": cache_steps / max(steps, 1)}


def model_survival_table(train: pl.DataFrame, hit_bins: np.ndarray, k: int) -> np.ndarray:
    """[bins, K] empirical P(model accepted >= j | recent model hit-rate bin) on the training rows."""
    b = np.digitize(train["hist_model_hit"].to_numpy(), hit_bins)
    acc = train["model_acc"].to_numpy()
    ge = acc[:, None] >= np.arange(1, k + 1)[None, :]  # [N, K]
    nb = len(hit_bins) + 1
    tab = np.zeros((nb, k))
    np.add.at(tab, b, ge)
    n = np.bincount(b, minlength=nb)[:, None]
    return np.divide(tab, n, out=np.tile(ge.mean(0), (nb, 1)), where=n > 0)
