"""The cost model learned live from the engine's own step times (docs/budget.md), the profiled table its prior.

Glossary:
  shape        (n requests, p draft passes, T target tokens) of a decode step; its prior price is the
               prior cost model's step_ms(n, p, T) (scheduling/cost.py) at the table's context
  ratio        (actual ms - the KV read its context C adds over the table's) / prior ms of one step
  bucket       the last `window` ratios of one shape (a ring); the first `warmup` steps of every shape
               are dropped (allocator, page faults, JIT: the outliers that make a shape look dear)
  median       per bucket the median of its window: a spike moves it only when it fills half the window
  fit          every `refit_every` steps the curve ordinates y = y0 (1 + delta) of verify, draft and the
               fixed drafting part are refit: delta = argmin sum_b m_b (x_b . delta - (median_b - 1))^2
               + PRIOR_COUNT |delta|^2, x_b,i = (weight of ordinate i in shape b's price) y0_i / prior_b,
               m_b = steps learned in bucket b (after its warm-up; the median reads the recent window,
               the weight all of them). PRIOR_COUNT is the prior's pseudo-count: a bucket with m steps
               pulls its ordinates m / (m + PRIOR_COUNT) of the way to what it measured; ordinates no
               step touches keep the prior, unless the isotonic fit that makes the curves non-decreasing
               again (weighted by each ordinate's steps) pools them with measured neighbours. The result
               is a CostTable like any other (`snapshot` writes it; `--cost FILE` reads it)
  probe        a step on a fixed schedule (every `probe_every`-th step) that verifies a depth fixed by the
               step count alone, cycling 0..K: shapes the policy no longer picks get fresh timings. The
               depth depends on the step count only, never on a drawn token: lossless, like fixed K
  ratio metric actual / the current model's prediction, for `/metrics` (serve)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from avkit.scheduling.cost import CostTable, interp_curve, isotonic
from avkit.staged import StagedOutputs

PRIOR_COUNT = 8.0  # steps the prior counts for, per ordinate (module note)
LEARNED = ("verify_ms", "draft_ms", "draft_fixed_ms")  # the curves the fit moves


@dataclass
class CostLearner:
    """Windowed medians per shape, refit into the prior's curves; `model` is the current cost model."""

    prior: CostTable
    window: int = 32  # ratios kept per shape
    warmup: int = 2  # first steps of every shape dropped
    refit_every: int = 64  # steps between refits
    probe_every: int = 97  # a probe step every this many steps (0: never)
    prior_count: float = PRIOR_COUNT
    model: CostTable | None = None
    steps: int = 0  # steps timed so far (the probe schedule's clock)
    buckets: dict = field(default_factory=dict)  # (n, passes, tokens) -> [seen, deque of ratios]

    def __post_init__(self):
        self.model = self.model or self.prior

    def probe_depth(self, k: int) -> int | None:
        """The depth the coming step verifies if it is a probe (None: not a probe). Step count only."""
        if self.probe_every <= 0 or self.steps % self.probe_every != self.probe_every - 1:
            return None
        return (self.steps // self.probe_every) % (k + 1)

    def observe(self, num_requests: int, passes: int, tokens: int, ms: float, context_tokens: int | None = None,
                learn: bool = True) -> float:
        """One step's wall time -> actual / the current model's prediction (the ratio metric). `learn`:
        False for steps whose time holds work the shape does not price (a catch-up prefill)."""
        self.steps += 1
        predicted = float(self.model.step_cost(num_requests, passes, tokens, context_tokens))
        if learn and ms > 0:  # the step's time at the table's context: its own context's KV read moved back
            at_table = ms - float(self.prior.context_cost(num_requests, context_tokens)
                                  - self.prior.context_cost(num_requests))
            prior = float(self.prior.step_cost(num_requests, passes, tokens))
            bucket = self.buckets.setdefault((num_requests, passes, tokens), [0, deque(maxlen=self.window)])
            bucket[0] += 1
            if bucket[0] > self.warmup and prior > 0:
                bucket[1].append(at_table / prior)
        if self.steps % self.refit_every == 0:
            self.refit()
        return ms / predicted if predicted > 0 else float("nan")

    def refit(self) -> CostTable:
        """The ridge fit of the module note; `model` becomes its CostTable."""
        keys = [k for k, (_, ratios) in self.buckets.items() if ratios]
        if not keys:
            return self.model
        shape = np.asarray(keys, dtype=np.float64)  # [B, 3] n, passes, tokens
        n, passes, tokens = shape.T
        median = np.asarray([np.median(self.buckets[k][1]) for k in keys])  # [B]
        m = np.asarray([self.buckets[k][0] - self.warmup for k in keys], dtype=np.float64)  # [B] steps learned
        prior_ms = self.prior.step_cost(n, passes, tokens)  # [B]
        cols, names = [], []
        for name in LEARNED:  # ordinate i's weight in each shape's price, times the ordinate
            xs, ys = self.prior.curve(name)
            if not getattr(self.prior, name) and name == "draft_fixed_ms":
                continue
            x = tokens if name == "verify_ms" else n
            scale = passes if name == "draft_ms" else ((passes > 0) * 1.0 if name == "draft_fixed_ms" else 1.0)
            for i in range(xs.size):  # interp_curve is linear in the ordinates: its weights, one column each
                unit = np.zeros_like(ys)
                unit[i] = 1.0
                cols.append(scale * interp_curve(x, xs, unit) * ys[i] / prior_ms)
                names.append((name, i))
        x_mat = np.stack(cols, 1)  # [B, P]
        used = np.abs(x_mat).sum(0) > 0
        delta = np.zeros(len(names))
        a = x_mat[:, used]
        lhs = a.T @ (m[:, None] * a) + self.prior_count * np.eye(a.shape[1])
        delta[used] = np.linalg.solve(lhs, a.T @ (m * (median - 1.0)))
        evidence = (m[:, None] * np.abs(x_mat)).sum(0)  # [P] steps behind each ordinate
        curves = {}
        for name in LEARNED:
            idx = [j for j, (nm, _) in enumerate(names) if nm == name]
            if idx:  # monotone again, weighted by evidence: an untouched ordinate follows its measured neighbours
                ys = self.prior.curve(name)[1]
                curves[name] = isotonic(np.maximum(ys * (1.0 + delta[idx]), 0.0), evidence[idx] + 1e-3)
        meta = {**self.prior.meta, "source": "learned", "steps": self.steps, "shapes": len(keys),
                "prior_count": self.prior_count, "window": self.window, "prior": self.prior.meta.get("source", "")}
        self.model = replace(self.prior.with_curves(**curves), meta=meta)
        return self.model

    def snapshot(self, path) -> None:
        """Write the learned model atomically (a temp file renamed; a failed write leaves the old one)."""
        with StagedOutputs() as outputs:
            self.refit().save(path, outputs)


__all__ = ["PRIOR_COUNT", "CostLearner"]
