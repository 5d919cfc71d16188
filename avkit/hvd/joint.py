"""Cache and model drafts competing for one verification budget (docs/hvd.md "One budget, live"; docs/budget.md):
one step (`joint_step`), the live router around it (`JointRouter`) and its batched replay (`simulate_batched`).

Glossary:
  survival   per row, S^c[r, j] = P(cache draft accepted >= j) from the payoff MLP's survival head (0 past
             min(draft length, wanted drafts)); S^m[r, j] from a table keyed by the recent model hit rate
             (`model_survival_table`)
  budget     b slots over the batch: E(b) = N + the top-b survivals, cost(b) = draft(n_model, K) [n_model > 0]
             + N c_cache + verify(N + b) (`CostTable.step_cost`, target forwards); b* = argmax E(b) / cost(b),
             ties to the smaller b (scheduling/plan.py). Survival falls with j, so each row verifies a prefix
  limit      per row, the planned prefix: the model drafter is asked for exactly that many tokens
  catch-up   the draft model follows a request only while it drafts for it (`CostTable.catch_up_cost`)
Lossless: the features, the hit history of verified steps and the costs are fixed before the model draws
anything, so the limits never depend on this step's draws (docs/lossless.md).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import torch

from avkit.errors import ConfigError
from avkit.hvd.cost import cost_from_json, linear_table
from avkit.hvd.features import feature_matrix
from avkit.hvd.path import Route, request_runs, route_cycles, step_price
from avkit.hvd.payoff_mlp import PayoffMLP
from avkit.scheduling.cost import CostTable
from avkit.scheduling.plan import Plan, plan, single_group


def budget_plan(surv: np.ndarray, n_req: int, step: np.ndarray) -> Plan:
    """[N, K] survivals (0 = no slot) -> scheduling/plan.py's plan of one step, costs in target forwards:
    cost(b) = step[N + b], `step` [N + N K + 1] the step's cost by target tokens. Host survivals, so the
    plan runs on the host (named explicitly: the live drafter makes every other tensor on its inputs' device)."""
    cpu = torch.device("cpu")
    s = torch.as_tensor(np.ascontiguousarray(surv, dtype=np.float64), device=cpu)
    n = s.shape[0]
    one = lambda v: torch.tensor([v], device=cpu)
    return plan(s, (s > 0).sum(1), single_group(n, cpu), 1, num_sampling=one(n_req), num_scheduled=one(n_req),
                fixed_ms=one(0.0), verify_ms=torch.as_tensor(step, dtype=torch.float64), surv=s)


class RunningRate:
    """The long-run rate lambda (tokens per target forward) options are compared against: per batch size n, the
    decayed sums of planned E over planned cost. Per n, since the rate is the operating point's (16 rows make ~16
    tokens per ~4 forwards, one row ~2 per ~1.3); planned, not realized, values: it never reads a step's draws."""

    def __init__(self, decay: float = 0.95):
        self.decay = decay
        self.sums: dict[int, tuple[float, float]] = {}  # n -> (decayed planned tokens, decayed planned cost)

    def value(self, n: int) -> float | None:
        """lambda at batch size n; None before a step at that size (the router is then myopic)."""
        tokens, cost = self.sums.get(n, (0.0, 0.0))
        return tokens / cost if cost > 0 else None

    def update(self, n: int, expected: float, cost: float) -> None:
        tokens, c = self.sums.get(n, (0.0, 0.0))
        self.sums[n] = (self.decay * tokens + expected, self.decay * c + cost)


def joint_step(cs: np.ndarray, ms: np.ndarray, cost: CostTable, k: int,
               rate: RunningRate | None = None, lag: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One step of joint routing + budget for n requests with cache / model survivals [n, K].

    Options: (a) the draft model runs for the requests that take its draft (K draft steps over those rows,
    plus the catch-up of rows it has not followed: `cost.catch_up_cost(lag)`, `lag` [n] the tokens it lacks
    per row), each request taking the draft with the larger expected accepted length; (a') the same without the
    rows that need a catch-up (they take the cache or nothing); (b) the model does not run, every request
    verifies its cache draft or nothing. Each option's slots compete for one budget (b* = argmax E(b) /
    cost(b), scheduling/plan.py). Between the options:
      without `rate`: the larger E / cost (myopic: the best rate of this step alone);
      with `rate`:    the larger E - lambda cost, lambda = the running rate at this batch size (Dinkelbach's
                      criterion for the long-run tokens / cost; why it matters: docs/hvd.md "One budget, live").
    Returns use_cache [n] bool and verified prefix lengths [n]; `rate` is updated with the choice."""
    n = len(cs)
    lam = rate.value(n) if rate is not None else None
    catch = np.zeros(n) if lag is None else cost.catch_up_cost(lag)  # [n] target forwards
    tokens = np.arange(n + cs.size + 1)  # [T+1] target tokens the step may verify
    wants = cs.sum(1) < ms.sum(1)  # [n] rows whose model draft is worth more
    options = [m for i, m in enumerate((wants, wants & (catch == 0)))
               if m.any() and not (i == 1 and np.array_equal(m, wants))] + [np.zeros(n, dtype=bool)]
    best = None
    for model in options:  # [n] rows the draft model drafts
        # every row looked the cache up (its survival is a feature of the lookup)
        step = step_price(cost, k, n, n - int(model.sum()), tokens - n, True) + float(catch[model].sum())
        p = budget_plan(np.where(model[:, None], ms, cs), n, step)
        e, c = float(p.expected[0]), float(p.cost_ms[0])
        score = e / c if lam is None else e - lam * c
        if best is None or score > best[0]:
            best = (score, ~model, p.num_verify.numpy(), e, c)
    if rate is not None:
        rate.update(n, best[3], best[4])
    return best[1], best[2]


@dataclass(frozen=True)
class JointRouter:
    payoff: PayoffMLP  # survival head
    model_surv: np.ndarray  # [bins + 1, K] P(model accepted >= j | hit-rate bin)
    hit_bins: np.ndarray  # [bins] inner edges of the hit-rate bins
    cost: CostTable = field(default_factory=linear_table)
    rate: RunningRate = field(default_factory=RunningRate, compare=False)  # lambda: planned tokens / cost so far

    def __post_init__(self):
        if self.payoff.head != "survival":
            raise ConfigError("joint routing needs a survival-head payoff model (payoff_survival.pt)")
        if self.model_surv.shape != (len(self.hit_bins) + 1, self.payoff.k):
            raise ConfigError(f"joint routing: model survival table has shape {self.model_surv.shape}, expected "
                              f"({len(self.hit_bins) + 1}, {self.payoff.k})")

    @classmethod
    def from_extra(cls, payoff: PayoffMLP, extra: dict, path: str = "payoff file") -> JointRouter:
        """The router from what `avkit hvd` saved beside the survival head (hvd/fit.py `_write`)."""
        missing = [k for k in ("model_surv", "hit_bins") if k not in extra]
        if missing:
            raise ConfigError(f"{path}: survival payoff model lacks {missing} (written by an older `avkit hvd`; "
                              "rerun it)")
        cost = cost_from_json(extra.get("cost", {}))
        return cls(payoff, np.asarray(extra["model_surv"], dtype=np.float64),
                   np.asarray(extra["hit_bins"], dtype=np.float64), cost)

    def model_survival(self, hist_model_hit: np.ndarray) -> np.ndarray:
        """[R] recent model hit rates -> [R, K] model-draft survival."""
        return self.model_surv[np.digitize(hist_model_hit, self.hit_bins)]

    def decide(self, cols: dict[str, np.ndarray], wanted: np.ndarray,
               lag: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Row features ([B] per name), drafts wanted [B] and the tokens the draft model lacks per row [B] (its
        catch-up is priced; None: free) -> (use_cache [B] bool, limit [B] int64)."""
        k = self.payoff.k
        j = np.arange(1, k + 1)[None, :]  # [1, K]
        cap = np.minimum(cols["draft_len"], wanted)[:, None]  # [B, 1]
        cs = self.payoff.predict_survival(feature_matrix(cols, self.payoff.feature_names)) * (j <= cap)  # [B, K]
        ms = self.model_survival(cols["hist_model_hit"]) * (j <= wanted[:, None])  # [B, K]
        use, limit = joint_step(cs, ms, self.cost, k, self.rate, lag)
        return use & (cols["draft_len"] > 0), np.asarray(limit, dtype=np.int64)


def simulate_batched(table: pl.DataFrame, route: Route, cost: CostTable, k: int, concurrency: int,
                     survivals: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, float]:
    """Decode the table's requests `concurrency` at a time in lockstep (a waiting request takes a finished one's
    slot), each step priced by `CostTable.step_cost`. Without `survivals`, `route` decides and every drafted slot
    is verified (a request's cycles do not depend on the batch, only when they run does). With `survivals` =
    (cache [R, K], model [R, K]) each step is a `joint_step` with a running rate, as live (`route` unused), the
    draft model's catch-up priced from its first model draft of a request on (the prompt: `log_prompt_len`)."""
    starts, lengths = request_runs(table)  # [G], [G]
    if survivals is not None:
        step, uc, verify, catch = _joint_steps(table, cost, k, concurrency, survivals)
        return _accounting(cost, k, concurrency, int(lengths.sum()), step, uc, verify, True, catch)
    c = route_cycles(table, route, k)
    start, free = np.zeros(len(starts), dtype=np.int64), [0] * min(concurrency, len(starts))  # free: slots' next step
    for g, n in enumerate(np.bincount(c.request, minlength=len(starts)).tolist()):  # requests in queue order
        start[g] = heapq.heappop(free)
        heapq.heappush(free, int(start[g]) + n)
    return _accounting(cost, k, concurrency, int(lengths.sum()), start[c.request] + c.index, c.use_cache, c.verify,
                       route.consults_cache, 0.0)


def _accounting(cost: CostTable, k: int, concurrency: int, tokens: int, step, uc, verify, lookup: bool,
                catch: float) -> dict[str, float]:
    """Rows (their step [C], cache drafted [C], verified [C]) summed per step and priced; `lookup`: every step
    looks the cache up (else those with a cache row); `catch`: the catch-ups' price."""
    steps = int(step.max()) + 1 if step.size else 0
    per = lambda w: np.bincount(step, weights=w, minlength=steps)  # [S]
    rows = per(None)
    spent = float(step_price(cost, k, rows, per(uc), per(verify), lookup).sum()) + catch
    shares = per(uc & (verify > 0)) / np.maximum(rows, 1)  # [S] a cache row with nothing to verify is a target step
    return {"concurrency": concurrency, "steps": steps, "tokens": tokens, "throughput": tokens / spent,
            "cache_share": float(shares.sum()) / max(steps, 1)}


def _joint_steps(table: pl.DataFrame, cost: CostTable, k: int, concurrency: int,
                 survivals: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """`joint_step` over the batch, step by step (each decision moves the running rate the next one reads):
    (step [C], use_cache [C], verified [C]) of every row-step, and the catch-ups' price."""
    rate = RunningRate()
    starts, lengths = request_runs(table)  # [G], [G]
    cache_acc, model_acc = table["cache_acc"].to_numpy(), table["model_acc"].to_numpy()
    dlen = table["draft_len"].to_numpy()
    j = np.arange(1, k + 1)[None, :]
    queue, live = list(range(len(starts)))[::-1], []
    pos = np.zeros(len(starts), dtype=np.int64)
    follows = "log_prompt_len" in table.columns
    prompt = (np.rint(np.expm1(table["log_prompt_len"].to_numpy()[starts])).astype(np.int64)
              if follows else np.zeros(len(starts), dtype=np.int64))  # [G]
    have = prompt * 0  # [G] tokens the draft model holds
    rec, catch = [], 0.0
    while queue or live:
        live = [g for g in live if pos[g] < lengths[g]]
        while queue and len(live) < concurrency:
            live.append(queue.pop())
        if not live:
            break
        g = np.array(live)
        r = starts[g] + pos[g]  # [n] replay rows
        cs = survivals[0][r] * (j <= dlen[r][:, None])  # [n, K] zero beyond each cache draft
        lag = prompt[g] + pos[g] - have[g] if follows else None  # [n]
        uc, verify = joint_step(cs, survivals[1][r], cost, k, rate, lag)
        acc = np.minimum(np.where(uc, cache_acc[r], model_acc[r]), verify)
        if follows:  # the rows the model drafts for catch up first; it keeps the accepted drafts
            drafts = ~uc & (verify > 0)  # [n] (live asks it for the planned prefix)
            catch += float(cost.catch_up_cost(lag[drafts]).sum())
            have[g] = np.where(drafts, prompt[g] + pos[g] + np.minimum(verify - 1, acc), have[g])
        rec.append((np.full(len(g), len(rec)), uc, verify))
        pos[g] += acc + 1
    step, uc, verify = (np.concatenate(x) for x in zip(*rec)) if rec else (np.zeros(0, np.int64),) * 3
    return step, uc.astype(bool), verify, catch


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
