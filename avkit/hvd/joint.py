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

from dataclasses import dataclass, field

import numpy as np
import polars as pl
import torch

from avkit.errors import ConfigError
from avkit.hvd.cost import cost_from_json, linear_table, summary
from avkit.hvd.features import feature_matrix
from avkit.hvd.path import Route, decode, request_runs, route_decide, step_price
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

    def __post_init__(self):  # the payoff's head is checked where its survival is read (`predict_survival`)
        if self.model_surv.shape != (len(self.hit_bins) + 1, self.payoff.k):
            raise ConfigError(f"joint routing: model survival table has shape {self.model_surv.shape}, expected "
                              f"({len(self.hit_bins) + 1}, {self.payoff.k})")

    @classmethod
    def from_extra(cls, payoff: PayoffMLP, extra: dict, path: str = "payoff file") -> JointRouter:
        """The router from what `avkit hvd` saved beside the survival head (`extra`)."""
        missing = [k for k in ("model_surv", "hit_bins") if k not in extra]
        if missing:
            raise ConfigError(f"{path}: survival payoff model lacks {missing} (written by an older `avkit hvd`; "
                              "rerun it)")
        cost = cost_from_json(extra.get("cost", {}))
        return cls(payoff, np.asarray(extra["model_surv"], dtype=np.float64),
                   np.asarray(extra["hit_bins"], dtype=np.float64), cost)

    def extra(self) -> dict:
        """What `from_extra` reads back, saved beside the survival head."""
        return {"model_surv": self.model_surv.tolist(), "hit_bins": self.hit_bins.tolist(), "cost": summary(self.cost)}

    def survivals(self, cols: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Row features ([R] per name) -> ([R, K] cache-draft survival, zero past the draft; [R, K] model's, by the
        row's recent model hit rate)."""
        x = feature_matrix(cols, self.payoff.feature_names)
        return self.payoff.predict_survival(x), self.model_surv[np.digitize(cols["hist_model_hit"], self.hit_bins)]

    def decide(self, cols: dict[str, np.ndarray], wanted: np.ndarray,
               lag: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Row features ([B] per name), drafts wanted [B] and the tokens the draft model lacks per row [B] (its
        catch-up is priced; None: free) -> (use_cache [B] bool, limit [B] int64)."""
        within = np.arange(1, self.payoff.k + 1)[None, :] <= wanted[:, None]  # [B, K]
        cs, ms = self.survivals(cols)
        use, limit = joint_step(cs * within, ms * within, self.cost, self.payoff.k, self.rate, lag)
        return use & (cols["draft_len"] > 0), np.asarray(limit, dtype=np.int64)


def simulate_batched(table: pl.DataFrame, route: Route | None, cost: CostTable, k: int, concurrency: int,
                     survivals: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, float]:
    """Decode the table's requests `concurrency` at a time in lockstep (`path.decode`), each step priced by
    `CostTable.step_cost`. Without `survivals`, `route` decides and every drafted slot is verified. With
    `survivals` = (cache [R, K], zero past each draft; model [R, K]) each step is a `joint_step` with a running rate, as live (`route`
    unused), the draft model's catch-up priced from its first model draft of a request on."""
    if survivals is None:
        c = decode(table, concurrency, route_decide(table, route, k))
    else:
        rate = RunningRate()
        c = decode(table, concurrency, lambda r, lag: joint_step(survivals[0][r], survivals[1][r], cost, k, rate, lag),
                   catch_up=cost)
    steps = int(c.step.max()) + 1 if c.step.size else 0
    per = lambda w: np.bincount(c.step, weights=w, minlength=steps)  # [S]
    rows = per(None)
    lookup = survivals is not None or route.consults_cache  # every row looks the cache up, else cache rows only
    spent = float(step_price(cost, k, rows, per(c.use_cache), per(c.verify), lookup).sum()) + c.catch_up
    shares = per(c.use_cache & (c.verify > 0)) / np.maximum(rows, 1)  # [S] a cache row verifying nothing: target
    tokens = int(request_runs(table)[1].sum())
    return {"concurrency": concurrency, "steps": steps, "tokens": tokens, "throughput": tokens / spent,
            "cache_share": float(shares.sum()) / max(steps, 1)}


HIT_BINS = np.linspace(0, 1, 11)[1:-1]  # inner edges of the recent model hit-rate bins


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
