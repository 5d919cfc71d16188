"""Routers for Hybrid Verified Decoding: per request and position, verify the cache draft or run
the draft model (HVD paper, seed 003 in docs/seeds.md; docs/hvd.md).

Glossary:
  payoff        the cache draft's accepted length y (replay oracle, `avkit.hvd.replay`)
  tau           threshold on a predicted payoff: verify the cache draft iff prediction > tau;
                chosen on the validation split to maximize simulated throughput (`avkit.hvd.path`)
  survival      S_j = P(y >= j); a cycle verifying b cache tokens yields 1 + sum_{j<=b} S_j tokens
Routers (registry `ROUTERS`: name -> a new router with `fit(train, val, ctx)` and `route(table, ctx)` -> Route;
the rules and `mlp` also route the live drafter's columns, name -> [B]: one implementation live and replayed):
  model     never the cache (the model-only baseline; pays no cache lookup)
  suffix    the cache's draft, else a plain target step: SuffixDecoding alone, no draft model (the
            cache-only baseline; vLLM's `suffix` method)
  cache     the cache's draft when it has one, else the draft model (cache first: already a hybrid)
  arctic    ArcticInference's rule: the cache iff its score >= the model draft length K
  table     smoothed acceptance table keyed by (match-length bucket, draft position j):
            p(j | bucket) = (accepted_j + a * p_j) / (reached_j + a), expected payoff
            sum_{j<len} prod_{i<=j} p(i | bucket), thresholded at tau
  mlp       `PayoffMLP` mean head thresholded at tau (the paper's router)
  survival  `PayoffMLP` survival head: verify the cache prefix b that maximizes expected tokens per
            cost when that beats the model drafter's expected tokens per cost (its survival from a
            table keyed by recent model hit rate, shrunk by a scale chosen on validation);
            `avkit.hvd.joint` lets a whole batch's cache and model slots compete for one
            verification budget with the same curves
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import polars as pl

from avkit.config import PayoffConfig
from avkit.errors import ConfigError
from avkit.hvd.cost import linear_table
from avkit.hvd.features import ALL_FEATURES, feature_matrix
from avkit.hvd.joint import HIT_BINS, JointRouter, model_survival_table, simulate_batched
from avkit.hvd.path import Route, full_route, throughput
from avkit.hvd.payoff_mlp import PayoffMLP
from avkit.scheduling.cost import CostTable
from avkit.trace import labels

MATCH_BUCKETS = np.array([1, 2, 3, 4, 6, 9, 13, 17])  # lower edges of the match-length buckets
MODEL_SCALES = (1.0, 0.9, 0.8, 0.6, 0.0)  # shrinks of the model survival the joint router is validated over


@dataclass(frozen=True)
class RouterContext:
    """What routers need besides the rows: K, the cost model, the feature set, the MLP config."""

    k: int
    cost: CostTable = field(default_factory=linear_table)
    features: tuple[str, ...] = ALL_FEATURES
    payoff: PayoffConfig = PayoffConfig()


def choose_tau(pred: np.ndarray, val: pl.DataFrame, ctx: RouterContext, grid: int = 40) -> float:
    """The threshold (among prediction quantiles) with the best simulated validation throughput."""
    has = val["draft_len"].to_numpy() > 0
    cands = np.unique(np.quantile(pred[has], np.linspace(0, 1, grid + 1))) if has.any() else np.zeros(1)
    cands = np.r_[cands[0] - 1.0, cands]  # also "always the cache"
    scores = [throughput(val, full_route(val, pred > tau), ctx.cost, ctx.k) for tau in cands]
    return float(cands[int(np.argmax(scores))])


@dataclass
class Rule:
    """A router with nothing to fit: `RULES[name](table, ctx)` -> Route."""

    name: str

    def fit(self, train, val, ctx) -> None:
        pass

    def route(self, table, ctx) -> Route:
        return RULES[self.name](table, ctx)


RULES: dict[str, Callable[[pl.DataFrame, RouterContext], Route]] = {
    "model": lambda t, ctx: full_route(t, np.zeros(len(t["draft_len"]), dtype=bool), consults_cache=False),
    # every row is a cache row: an empty draft verifies nothing, i.e. a target-only step (no draft model)
    "suffix": lambda t, ctx: Route(np.ones(len(t["draft_len"]), dtype=bool), np.asarray(t["draft_len"], np.int64)),
    "cache": lambda t, ctx: full_route(t, np.ones(len(t["draft_len"]), dtype=bool)),
    "arctic": lambda t, ctx: full_route(t, np.asarray(t["score"]) >= ctx.k),
}


@dataclass
class Thresholded:
    """A predicted payoff (`predict`, fitted by `_fit`) thresholded at tau, chosen on the validation rows."""

    tau: float = 0.0

    def fit(self, train, val, ctx) -> None:
        self._fit(train, val, ctx)
        self.tau = choose_tau(self.predict(val, ctx), val, ctx)

    def route(self, table, ctx) -> Route:
        return full_route(table, self.predict(table, ctx) > self.tau)


@dataclass
class AcceptanceTable(Thresholded):
    prior_strength: float = 10.0  # a: pseudo-observations pulling each cell to its position's rate
    name: str = "table"
    cond: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # [buckets, K] P(accept j | reached j)

    def _fit(self, train, val, ctx) -> None:
        rows = train.filter(pl.col("draft_len") > 0)
        b = np.searchsorted(MATCH_BUCKETS, rows["match_len"].to_numpy(), side="right") - 1  # [N]
        acc, dl = rows["cache_acc"].to_numpy(), rows["draft_len"].to_numpy()
        j = np.arange(ctx.k)
        reached = labels.observed(j[None, :], dl[:, None], acc[:, None])  # [N, K] slot j labelled
        accepted = j[None, :] < acc[:, None]  # [N, K]
        r, a = np.zeros((len(MATCH_BUCKETS), ctx.k)), np.zeros((len(MATCH_BUCKETS), ctx.k))  # [buckets, K] each
        np.add.at(r, b, reached)
        np.add.at(a, b, accepted & reached)
        prior = a.sum(0) / np.maximum(r.sum(0), 1)  # [K] per-position rate over all buckets
        den = r + self.prior_strength
        self.cond = np.divide(a + self.prior_strength * prior, den, out=np.broadcast_to(prior, r.shape).copy(),
                              where=den > 0)  # an empty cell (only when a = 0) falls back to the prior

    def predict(self, table, ctx) -> np.ndarray:
        b = np.searchsorted(MATCH_BUCKETS, np.maximum(table["match_len"].to_numpy(), 1), side="right") - 1
        surv = np.cumprod(self.cond[b], axis=1)  # [N, K] P(y >= j + 1 | bucket)
        mask = np.arange(ctx.k)[None, :] < table["draft_len"].to_numpy()[:, None]
        return (surv * mask).sum(1)


@dataclass
class MLPRouter(Thresholded):
    name: str = "mlp"
    head: str = "mean"
    model: PayoffMLP | None = None

    def _fit(self, train, val, ctx) -> None:
        """The payoff MLP on the rows with a cache draft, the validation rows choosing its epoch."""
        xy = [(feature_matrix(t, ctx.features), t["cache_acc"].to_numpy())
              for t in (train.filter(pl.col("draft_len") > 0), val.filter(pl.col("draft_len") > 0))]
        self.model = PayoffMLP(ctx.features, ctx.k, ctx.payoff, head=self.head).fit(*xy[0], *xy[1])

    def predict(self, table, ctx) -> np.ndarray:
        return np.where(np.asarray(table["draft_len"]) > 0, self.model.predict(feature_matrix(table, ctx.features)), 0.0)


@dataclass
class SurvivalRouter(MLPRouter):
    name: str = "survival"
    head: str = "survival"
    hit_bins: np.ndarray = field(default_factory=lambda: HIT_BINS)
    model_surv: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # [bins, K] scale * P(model acc >= j)
    model_scale: float = 1.0  # the validated shrink of the model's survival (MODEL_SCALES)

    def fit(self, train, val, ctx) -> None:
        self._fit(train, val, ctx)
        raw = model_survival_table(train, self.hit_bins, ctx.k)
        self.model_scale = self._choose_model_scale(raw, val, ctx)
        self.model_surv = self.model_scale * raw

    def _choose_model_scale(self, raw: np.ndarray, val: pl.DataFrame, ctx: RouterContext) -> float:
        """The shrink of the model's survival table with the best joint-routing throughput on the validation
        requests, decoded one at a time (the `tau` of the joint router). The table is the model's average
        acceptance at a recent hit rate, but the router asks for the model where the cache is weak, i.e. in
        text neither has seen, where the model does worse than its average; under dear drafting (a CPU)
        a scale below 1, down to 0 (no draft model: cache or nothing), is worth more. Ties keep the larger."""
        best = (-1.0, 1.0)
        for scale in MODEL_SCALES:
            self.model_surv = scale * raw
            tp = decode_batched({"survival": self}, "survival+budget", val, ctx, 1)["throughput"]
            if tp > best[0] * (1 + 1e-9):
                best = (tp, scale)
        return best[1]

    def joint(self, cost: CostTable) -> JointRouter:
        """The live joint router of this fit (what payoff_survival.pt holds)."""
        return JointRouter(self.model, self.model_surv, self.hit_bins, cost)

    def survivals(self, table, ctx) -> tuple[np.ndarray, np.ndarray]:
        """([R, K] cache-draft survival from the MLP head, [R, K] model-draft survival from the table)."""
        return self.joint(ctx.cost).survivals(dict(zip(table.columns, table.get_columns())))

    def route(self, table, ctx) -> Route:
        """Per row, the cache prefix b with the best expected tokens per cost, when that beats the model's."""
        c, dlen = ctx.cost, table["draft_len"].to_numpy()
        cache, model = self.survivals(table, ctx)  # [N, K] (zero beyond the draft), [N, K]
        b = np.arange(1, ctx.k + 1)
        cache_rate = (1 + np.cumsum(cache, 1)) / c.step_cost(1, 0, 1 + b, lookups=1)  # [N, K]
        model_rate = (1 + model.sum(1)) / c.step_cost(1, ctx.k, 1 + ctx.k, lookups=1)  # [N]
        use = (cache_rate.max(1) > model_rate) & (dlen > 0)
        return Route(use, np.minimum(cache_rate.argmax(1) + 1, dlen).astype(np.int64))


def decode_batched(fitted: dict, router: str, table: pl.DataFrame, ctx: RouterContext, concurrency: int) -> dict:
    """`simulate_batched` of a fitted router; `survival+budget`: the survival router's curves planned jointly."""
    r = fitted["survival" if router == "survival+budget" else router]
    surv = r.survivals(table, ctx) if router == "survival+budget" else None
    route = full_route(table, np.ones(table.height, dtype=bool)) if surv is not None else r.route(table, ctx)
    return simulate_batched(table, route, ctx.cost, ctx.k, concurrency, surv)


ROUTERS: dict[str, Callable] = {**{name: partial(Rule, name) for name in RULES},
                                 "table": AcceptanceTable, "mlp": MLPRouter, "survival": SurvivalRouter}


def make_router(name: str):
    if name not in ROUTERS:
        raise ConfigError(f"unknown hvd router {name!r}; choose from {sorted(ROUTERS)}")
    return ROUTERS[name]()
