"""The cost model learned live from the engine's own step times, the profiled table its prior (docs/budget.md
"The cost model learned live": shapes, bands, warm-up, probes, snapshot).

  bucket    per shape (n, m, passes, T, l, catch-ups) and its context and catch-up bands: the last `window`
            (ms, context, lag) after the first `warmup` steps; its medians are what it measured
  fit       when a shape has learned 1, 2, 4, ... steps and every `refit_every` steps, one ridge regression
            over the buckets, each weighted by its m_b learned steps:
                median_b / prior_b - 1 = x_b . delta + kv_b g_kv + look_b g_look
            delta: the relative change of each ordinate of the LEARNED curves (x_b,i = ordinate i's weight in
            b's price times the ordinate, / prior_b); g_kv moves kv_ms_per_token (kv_b = (context_b -
            held_context_b) u_kv / prior_b); g_look moves lookup_ms (look_b = l_b u_look / prior_b). Each
            unknown carries max(PRIOR_COUNT, e) pseudo-steps of its column's mean square, e the steps a learned
            prior's snapshot holds behind it (meta.evidence: each unknown's steps, its prior's included, at most
            `window`; 0 for a profiled table), so a restart resumes what the last run learned; the curves are
            made non-decreasing again by isotonic regression weighted by the steps behind each ordinate.
            A bucket whose drafting phase was timed apart (StepTime.drafting_ms, the engine on CPU) adds the
            same equation for that phase over the drafter's columns alone: at batch 1 a step's passes and
            verified tokens rise together, so its total cannot tell a draft pass from a verify token
  residual  per bucket without catch-ups, r_b = median_b / ridge_b(c_b), shrunk to the shape's (all bands, M_s
            steps, r_s their step-weighted mean r_b) from the prior's factor f0_b, then to the band's:
                F_b = f0_b + M_s / (M_s + PRIOR_COUNT) (r_s - f0_b)
                f_b = F_b + w_b (r_b - F_b),   w_b = m_b / (m_b + PRIOR_COUNT)
            stored in CostTable.shape_scale (applied by step_cost)
  probe     every `probe_every`-th step verifies a depth cycling 0..K by the step count alone (lossless); its
            step skips its shape's warm-up (a depth probed once every (K + 1) probe_every steps would otherwise
            teach nothing before its third probe)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from avkit.scheduling.cost import FREE_LAG, CostTable, context_band, interp_curve, isotonic, shape_keys
from avkit.step_types import StepTime

PRIOR_COUNT = 2.0  # steps the prior counts for, per unknown (module note: prior)
LEARNED = ("verify_ms", "draft_ms", "draft_fixed_ms", "prefill_ms", "request_ms")  # the curves the fit moves

@dataclass
class CostLearner:
    """Windowed medians per shape and context band, refit into the prior's curves, its KV slope and its lookup
    price; `model` is the current cost model."""

    prior: CostTable
    window: int = 32  # steps kept per shape
    warmup: int = 2  # first steps of every shape dropped
    refit_every: int = 64  # steps between refits
    probe_every: int = 16  # a probe step every this many steps (0: never; module note: probe)
    prior_count: float = PRIOR_COUNT
    model: CostTable | None = None
    steps: int = 0  # steps timed so far (the probe schedule's clock)
    buckets: dict = field(default_factory=dict)  # shape + bands -> [seen, deque of (ms, context tokens, lag)]

    def __post_init__(self):
        self.model = self.model or self.prior

    def probe_depth(self, k: int) -> int | None:
        """The depth the coming step verifies if it is a probe (None: not a probe). Step count only."""
        if self.probe_every <= 0 or self.steps % self.probe_every != self.probe_every - 1:
            return None
        return (self.steps // self.probe_every) % (k + 1)

    def shape(self, t: StepTime) -> tuple[tuple, float, float]:
        """A step's bucket key (module note), its context tokens (the prior's held context where not given) and
        its catch-ups' mean lag."""
        rows = t.num_requests if t.draft_rows is None else t.draft_rows
        context = t.context_tokens if t.context_tokens is not None else \
            float(self.prior.held_context(t.num_requests, t.tokens))
        lag = float(np.mean(t.catch_up)) if t.catch_up else 0.0  # [c] lags -> their mean
        n, m, passes, tokens, lookups, band = shape_keys(t.num_requests, t.passes, t.tokens, context, rows,
                                                         t.lookups).tolist()
        return (n, m, passes, tokens, lookups, len(t.catch_up), band, float(context_band(lag, 1))), context, lag

    def learned(self, t: StepTime) -> int:
        """Steps of `t`'s shape the current model has learned from (0: priced by what other shapes taught)."""
        return max(self.buckets.get(self.shape(t)[0], [0])[0] - self.warmup, 0)

    def predict(self, t: StepTime) -> float:
        """The current model's price of `t`'s shape (ms): its step and its catch-ups."""
        key, context, _ = self.shape(t)
        return float(self.model.step_cost(t.num_requests, t.passes, t.tokens, context, key[1], t.lookups)
                     + self.model.catch_up_cost(t.catch_up).sum())

    def observe(self, t: StepTime) -> float:
        """One step's shape and wall time -> actual / the current model's prediction (the ratio metric). Refits
        when the step's shape has learned 1, 2, 4, ... steps (up to its window: a new shape is priced from
        its own steps as soon as its warm-up is over), and every `refit_every` steps."""
        probe = self.probe_depth(0) is not None  # a probe's step is learned at once (module note: probe)
        self.steps += 1
        key, context, lag = self.shape(t)
        predicted, learned = self.predict(t), 0
        if t.ms > 0:
            bucket = self.buckets.setdefault(key, [0, deque(maxlen=self.window)])
            bucket[0] = max(bucket[0], self.warmup * probe) + 1
            if bucket[0] > self.warmup:
                bucket[1].append((t.ms, context, lag, math.nan if t.drafting_ms is None else t.drafting_ms))
            learned = bucket[0] - self.warmup
        if self.steps % self.refit_every == 0 or (0 < learned <= self.window and learned & (learned - 1) == 0):
            self.refit()
        return t.ms / predicted if predicted > 0 else float("nan")

    def _columns(self, n, rows, passes, tokens, catch, lag, base) -> tuple[list[np.ndarray], list[tuple[str, int]]]:
        """Ordinate i's weight in each bucket's prior price, times the ordinate, / the price: one column each."""
        p = self.prior
        pre = np.maximum(lag - 1.0, 1.0)  # [B] tokens each catch-up prefills (cost.py `catch_up_cost`)
        grid = catch * (lag > FREE_LAG) * (bool(p.prefill_tokens) and pre >= p.prefill_tokens[0])  # [B] on its grid
        below = catch * (lag > FREE_LAG) - grid  # [B] catch-ups priced as a draft pass over their rows
        uses = {"verify_ms": [(1.0, tokens)], "draft_ms": [(passes, rows), (below, pre)],
                "draft_fixed_ms": [((passes > 0) * 1.0, rows)], "prefill_ms": [(grid, pre)],
                "request_ms": [(1.0, n)]}  # (weight, x) terms
        cols, names = [], []
        for name in LEARNED:
            if not getattr(p, name):
                continue
            xs, ys = p.curve(name)
            for i in range(xs.size):  # interp_curve is linear in the ordinates: its weights, one column each
                unit = np.zeros_like(ys)
                unit[i] = 1.0
                cols.append(sum(w * interp_curve(x, xs, unit) for w, x in uses[name]) * ys[i] / base)
                names.append((name, i))
        return cols, names

    def _carried(self, names: list[tuple[str, int]]) -> np.ndarray:
        """[P] the steps a learned prior's snapshot holds behind each unknown (meta.evidence; 0 where it holds
        none: a profiled table, an older snapshot, a grid of another length)."""
        held = self.prior.meta.get("evidence")
        held = held if isinstance(held, dict) else {}
        out = np.zeros(len(names))  # [P]
        for name in dict.fromkeys(nm for nm, _ in names):
            at = [j for j, (nm, _) in enumerate(names) if nm == name]  # its columns (kv, lookup: one)
            v = held.get(name)
            if isinstance(v, list) and len(v) == len(at) and all(
                    isinstance(x, (int, float)) and math.isfinite(x) for x in v):
                out[at] = v
        return np.maximum(out, 0.0)

    def refit(self) -> CostTable:
        """The ridge fit of the module note; `model` becomes its CostTable."""
        keys = [k for k, (_, window) in self.buckets.items() if window]
        if not keys:
            return self.model
        n, rows, passes, tokens, lookups, catch = np.asarray([k[:6] for k in keys], dtype=np.float64).T  # [B] each
        windows = [np.asarray(self.buckets[k][1]) for k in keys]  # B x [w, 4] (ms, context, lag, drafting ms)
        ms, ctx, lag = np.asarray([np.median(w[:, :3], 0) for w in windows]).T  # [B] each
        timed = [w[~np.isnan(w[:, 3]), 3] for w in windows]  # B x the drafting phases timed apart
        drafting = np.asarray([np.median(d) if d.size else np.nan for d in timed])  # [B] nan: not timed
        m = np.asarray([self.buckets[k][0] - self.warmup for k in keys], dtype=np.float64)  # [B] steps learned
        p = replace(self.prior, shape_scale=())  # the ridge prices with the curves alone
        base = p.step_cost(n, passes, tokens, draft_rows=rows) + catch * p.catch_up_cost(lag)  # [B] no lookups
        extra = ctx - p.held_context(n, tokens)  # [B] context tokens beyond them
        target = (ms - base - p.kv_ms_per_token * extra - p.lookup_ms * lookups) / base  # [B]
        cols, names = self._columns(n, rows, passes, tokens, catch, lag, base)
        u_kv = float(np.median(base) / max(np.median(ctx), 1.0))
        u_look = float(p.draft_pass_cost(1))
        for name, col, scale in (("kv", extra, u_kv), ("lookup", lookups, u_look)):
            if np.any(col != 0) and scale > 0:
                cols.append(col * scale / base)
                names.append((name, scale))
        x_mat = np.stack(cols, 1)  # [B, P]
        # drafting phases timed apart: one more row per such bucket, the same equation over the drafter's columns
        # alone (its passes, catch-ups and cache lookups), scaled by the same price
        apart = ~np.isnan(drafting)  # [B]
        if apart.any():
            side = np.asarray([nm in ("draft_ms", "draft_fixed_ms", "prefill_ms", "lookup") for nm, _ in names])  # [P]
            p_draft = p.draft_cost(rows, passes) + catch * p.catch_up_cost(lag) + p.lookup_ms * lookups  # [B] prior's
            x_mat = np.concatenate([x_mat, x_mat[apart] * side], 0)  # [B + A, P]
            target = np.concatenate([target, ((drafting - p_draft) / base)[apart]])
        w = np.concatenate([m, m[apart]])  # [B + A] each row's steps learned
        used = np.abs(x_mat).sum(0) > 0
        carried = self._carried(names)  # [P] steps behind each unknown in a learned prior (module note: prior)
        count = np.maximum(self.prior_count, np.minimum(carried, self.window))  # [P] the prior's pseudo-steps
        prices = {"kv": p.kv_ms_per_token, "lookup": p.lookup_ms}  # the scalar unknowns' prior values
        while True:  # a KV slope or lookup price the fit would push below 0 stays at the prior; the rest refit
            delta = np.zeros(len(names))
            a = x_mat[:, used]
            square = (w[:, None] * a ** 2).sum(0) / (w[:, None] * (a != 0)).sum(0)  # [P'] each column's mean square
            lhs = a.T @ (w[:, None] * a) + np.diag(count[used] * square)  # the prior: count typical steps each
            delta[used] = np.linalg.solve(lhs, a.T @ (w * target))
            negative = np.asarray([nm in prices and prices[nm] + d * sc < 0 for (nm, sc), d in zip(names, delta)])
            if not negative.any():
                break
            used &= ~negative
        evidence = (w[:, None] * np.abs(x_mat)).sum(0) + carried  # [P] steps behind each unknown, the prior's too
        curves = {}
        for name in LEARNED:
            idx = [j for j, (nm, _) in enumerate(names) if nm == name]
            if idx:  # monotone again, weighted by evidence: an untouched ordinate follows its measured neighbours;
                # no price below 1% of the prior's (a price of 0 makes the work free, and CostTable.load refuses it)
                ys = p.curve(name)[1]
                curves[name] = isotonic(np.maximum(ys * (1.0 + delta[idx]), 0.01 * ys), evidence[idx] + 1e-3)
        moved = {nm: prices[nm] + d * scale for (nm, scale), d in zip(names, delta) if nm in prices}
        held = {}  # name -> [ordinates] (kv, lookup: one number) steps behind each, at most a window (a snapshot's)
        for j, (nm, _) in enumerate(names):
            held.setdefault(nm, []).append(round(float(min(evidence[j], self.window)), 3))
        meta = {**p.meta, "source": "learned", "steps": self.steps, "shapes": len(keys),
                "prior_count": self.prior_count, "window": self.window, "prior": p.meta.get("source", ""),
                "evidence": held}
        ridge = replace(replace(p, **curves), meta=meta, kv_ms_per_token=moved.get("kv", p.kv_ms_per_token),
                        lookup_ms=moved.get("lookup", p.lookup_ms))
        own = catch == 0  # [B] the buckets a factor prices (module note: residual)
        keys_b = np.asarray([k[:5] + k[6:7] for k in keys]).reshape(-1, 6)[own]  # [B', 6] their shape keys
        f0 = self.prior.shape_factor(keys_b)  # [B']
        ridge_ms = ridge.step_cost(n[own], passes[own], tokens[own], ctx[own], rows[own], lookups[own])  # [B']
        ratio = np.where(ridge_ms > 0, ms[own] / np.maximum(ridge_ms, 1e-300), f0)  # [B'] a price <= 0: no news
        steps = m[own]  # [B']
        shape = np.unique(keys_b[:, :5], axis=0, return_inverse=True)[1].reshape(-1)  # [B'] its shape, all bands
        total = np.bincount(shape, steps)[shape]  # [B'] the shape's steps in all its bands
        pooled = f0 + total / (total + self.prior_count) * (np.bincount(shape, steps * ratio)[shape] / total - f0)
        factor = pooled + steps / (steps + self.prior_count) * (ratio - pooled)  # [B']
        learned = {tuple(key): f for key, f in zip(keys_b.tolist(), factor.tolist()) if 0 < f < math.inf}
        kept = [e for e in self.prior.shape_scale if tuple(e[:6]) not in learned]  # the prior's, where unlearned
        self.model = replace(ridge, shape_scale=tuple(kept) + tuple((*key, f) for key, f in learned.items()))
        return self.model

    def snapshot(self, path) -> None:
        """Write the learned model atomically (a temp file renamed; a failed write leaves the old one)."""
        self.refit().save(path)
