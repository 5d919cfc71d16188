"""Adaptive verification (docs/estimator.md, docs/budget.md): the budgeted verify policy, `adaptive` and
`adaptive-stop` in POLICIES, with live estimator refits.

  confidence  c[r, j] = estimator.predict(feature[r, j], j), a lossless feature of the draft distribution
              only (never q of the drawn token), so trimming stays lossless
  budget      b* sized from draw-independent inputs (`sizing`), the top-b* live slots verified (plan.py)
  observed    slot j of r carries a label iff j < num_verify[r] and j <= num_accepted[r]; label = j <
              num_accepted[r]; trimmed slots and slots after the first rejection are censored
  hooks       the draft gate (gate.py) before drafting, the early stop (plan.py `continue_drafting`, `adaptive-stop`) after each
              draft pass, the cost learner (learn.py, `learn_cost`) after each step; a cost probe step drafts
              and verifies a depth set by the step count alone (lossless, as fixed K)
With estimator "none" it verifies every draft.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from avkit.config import DEFAULT_K, AdaptiveConfig
from avkit.errors import ConfigError
from avkit.estimators.base import Estimator, make_estimator
from avkit.estimators.coefficients import estimator_feature, load_estimator
from avkit.kernels.dispatch import Kernels
from avkit.scheduling.cost import CostTable, resolve_cost
from avkit.scheduling.gate import DraftGate
from avkit.scheduling.learn import CostLearner
from avkit.scheduling.plan import continue_drafting, plan, single_group, verify_lookup
from avkit.scheduling.policy import VerifyPolicy
from avkit.step_types import DraftBatch, Groups, Load, StepPlan, StepTime, VerifyOutcome
from avkit.trace import labels

log = logging.getLogger("avkit.adaptive")

def observed_labels(num_verify: torch.Tensor, num_accepted: torch.Tensor, k: int):
    """docs/estimator.md labels: (observed [B, K] bool, label [B, K] bool); label is meaningful where observed."""
    j = torch.arange(k, device=num_verify.device)[None, :]  # [1, K]
    observed = labels.observed(j, num_verify[:, None], num_accepted[:, None])  # [B, K]
    return observed, j < num_accepted[:, None]


@dataclass
class AdaptiveVerification(VerifyPolicy):
    """Verify each request's drafts up to the survival-ranked budget that maximizes tokens per ms."""

    cost: CostTable
    estimator: Estimator | None
    history: int = 1000  # refits kept in `trajectory`
    name: str = "adaptive"
    trajectory: list[dict] = field(default_factory=list)  # {"step", "refit", **estimator.state_dict()}
    steps: int = 0
    refits: int = 0
    draft_ms: torch.Tensor | None = None  # [G] drafting paid this step, summed by `continue_drafting`
    gate: DraftGate | None = None  # skips drafting for a step when it cannot pay (None: always draft)
    k: int = DEFAULT_K  # positions the estimator predicts (the width of the gate's rows)
    stop_drafting: bool = False  # stop an autoregressive drafter early (`continue_drafting`; `adaptive-stop`)
    kernels: Kernels | None = None  # the engine's kernel set: the plan's prefixes by its allocation kernel
    # Scores the suffix cache's rows (DraftBatch.cache_rows, HVD's hybrid drafter) with its own coefficients,
    # refit from those rows' labels only (None: a fresh one of the estimator's kind when cache rows appear)
    cache_estimator: Estimator | None = None
    cache_trajectory: list[dict] = field(default_factory=list)  # the cache estimator's refits, as `trajectory`
    cache_refits: int = 0
    learner: CostLearner | None = None  # learns `cost` from the engine's step times, probes (learn.py)
    _tables: dict = field(default_factory=dict, repr=False)  # (kind, device) -> cost lookups; (counts, ..) -> inputs

    def cache_scorer(self) -> Estimator:
        """The suffix cache's rows' estimator: `cache_estimator`, or (first asked) a fresh one of the model
        estimator's kind and settings, so the cache never borrows the model's coefficients."""
        if self.cache_estimator is None:
            est = self.estimator
            self.cache_estimator = make_estimator(est.name, k=getattr(est, "k", self.k),
                                                  **({"config": est.config} if hasattr(est, "config") else {}))
        return self.cache_estimator

    def confidences(self, batch: DraftBatch, k: int | None = None) -> torch.Tensor:
        """[B, K] acceptance predictions: the confidence kernel's (computed in the draft pass) or the estimator's
        from its feature; with `k`: [B, k], every position j < k from each request's position-0 feature. The
        cache's rows (`batch.cache_rows`) by the cache's estimator; on the features' device, no host read."""
        def predict(est):
            if k is None and est is self.estimator and batch.confidences is not None:
                return batch.confidences
            f = _feature(batch, est)  # [B, K]
            b, width = f.shape[0], k or f.shape[1]
            f = torch.nan_to_num((f if k is None else f[:, :1].expand(b, k)).detach().float(), nan=0.0)  # [B, width]
            positions = torch.arange(width, device=f.device).expand(b, width)
            if hasattr(est, "predict_torch"):
                return est.predict_torch(f, positions).float()
            # A plug-in estimator without a device path predicts in numpy (a host read per call).
            pred = est.predict(f.cpu().numpy().reshape(-1), positions.cpu().numpy().reshape(-1))
            return torch.as_tensor(np.asarray(pred, dtype=np.float32)).reshape(f.shape).to(f.device)
        conf = predict(self.estimator)
        return conf if batch.cache_rows is None else torch.where(batch.cache_rows[:, None], predict(self.cache_scorer()),
                                                                 conf)

    def confidence_coefficients(self, device):
        """(slope [1], intercepts [K]) for the confidence kernel in the draft pass, or None."""
        est = self.estimator
        return None if est is None or not hasattr(est, "kernel_coefficients") else est.kernel_coefficients(device)

    def sizing(self, batch: DraftBatch, conf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw-independent inputs that size b*: every position j of request r predicted from r's
        position-0 feature (q_0 depends on the prefix only) with position j's coefficients, and K
        nominal drafts for every request that drafted. Live features at j >= 1 are functions of the
        drawn x_0..x_{j-1}; letting them move b* would make k_r >= 1 depend on x_0 (lossy).
        An estimator that reads a whole slot's column (`per_position = False`: the simulator's oracle and
        recorded confidences) cannot predict position j from position 0: it sizes from `conf` (a bound)."""
        if not getattr(self.estimator, "per_position", True):
            return conf, batch.num_drafted
        k = batch.features[estimator_feature(self.estimator)].shape[1]
        return self.confidences(batch, k), torch.where(batch.num_drafted > 0, k, 0)

    def use_kernels(self, kernels: Kernels) -> None:
        self.kernels = kernels

    def probe(self) -> int | None:
        """The depth this step verifies if the cost learner's schedule makes it a probe (step count only)."""
        return None if self.learner is None or self.estimator is None else self.learner.probe_depth(self.k)

    def use_cost(self, cost: CostTable) -> None:
        """Price with `cost` from now on (a learned model): the kept lookup tables and the gate's go."""
        self.cost = cost
        self._tables.clear()
        if self.gate is not None:
            self.gate.use_cost(cost)

    def observe_step_time(self, timing: StepTime) -> float | None:
        """Feed the learner (when there is one); refits swap the model in. -> actual / predicted ms."""
        if self.learner is None:
            return None
        ratio = self.learner.observe(timing)
        if self.learner.model is not self.cost:
            self.use_cost(self.learner.model)
        return ratio

    def draft_this_step(self, load: Load) -> bool:
        """Before drafting: False skips speculation for this step (the gate; always True without one).
        A cost probe decides alone: depth 0 decodes target-only, any other depth drafts."""
        probe = self.probe()
        if probe is not None:
            return probe > 0
        return self.gate is None or self.estimator is None or \
            self.gate.draft_this_step(load.num_requests, load.lag, load.remaining)

    def draft_steps(self, batch: DraftBatch, groups: Groups) -> torch.Tensor | None:
        """[G] bool: `draft_this_step` for many steps in order, each step's sizing rows observed after its
        decision (as `num_verify` does live); None without a gate."""
        if self.gate is None or self.estimator is None:
            return None
        conf = self.confidences(batch)  # [B, K]
        full = self.sizing(batch, conf)[0]
        bounds = torch.searchsorted(groups.group, torch.arange(groups.num_groups + 1))  # [G+1]
        return torch.from_numpy(self.gate.replay(groups.num_requests.numpy(), full, bounds.numpy(),
                                                 (batch.num_drafted > 0).numpy()))

    def num_verify(self, batch: DraftBatch, load: Load | Groups) -> StepPlan:
        if self.estimator is None:
            return StepPlan(batch.num_drafted.clone(), None)
        conf = self.confidences(batch)  # [B, K]
        self.draft_ms = None  # size with the nominal drafting cost: the passes run depend on the draws
        sizing = self.sizing(batch, conf)
        # Drafting is paid before verification: K passes over the batch (nominal, the draws decide the rest).
        (b, k), many, drafts = conf.shape, isinstance(load, Groups), conf.shape[1]
        if many:  # a step that drafted pays K nominal passes
            drafted = torch.zeros(load.num_groups, dtype=torch.int64).index_add_(0, load.group, batch.num_drafted.cpu())
            drafts = np.where(drafted.numpy() > 0, k, 0)
        group, num_groups, n, inputs = self._inputs(load, b, drafts, conf.device)
        width = n * (max(k, self.k) + 1) + 1 if many else n + b * max(k, self.k) + 1
        num_verify = plan(conf, batch.num_drafted, group, num_groups, sizing=sizing, **inputs,
                          verify_ms=self._lookup("verify_cost", width, conf.device),
                          allocate=None if self.kernels is None or many else self.kernels.allocate).num_verify
        probe = self.probe() if isinstance(load, Load) else None
        if probe is not None:  # a cost probe verifies the depth its step count sets (lossless, as fixed K)
            num_verify = batch.num_drafted.clamp(max=probe)
        if self.gate is not None and isinstance(load, Load):  # Groups: observed by `draft_steps`
            # the gate's curve spans all K positions, even when fewer were drafted
            full = sizing[0] if conf.shape[1] == self.k else self.confidences(batch, self.k)
            drafted = batch.num_drafted > 0  # [B] the gate weighs draft-model passes: the model's rows
            self.gate.observe(full[drafted if batch.cache_rows is None else drafted & ~batch.cache_rows])
        return StepPlan(num_verify, conf)

    def _lookup(self, curve: str, size: int, device) -> torch.Tensor:
        """A cost curve's ms by count 0.. > size on `device` (`curve`: a CostTable method), built on the host once
        (grown when a step needs more)."""
        table = self._tables.get((curve, device))
        if table is None or table.numel() <= size:
            table = self._tables[(curve, device)] = verify_lookup(getattr(self.cost, curve), max(2 * size, 64), device)
        return table

    def _inputs(self, load: Load | Groups, rows: int, drafts, device) -> tuple[torch.Tensor, int, int, dict]:
        """(group [B], G, most target tokens a step schedules before its drafts, the plan's [G] inputs) of one
        step or many; fixed_ms = drafting `drafts` nominal passes ([G] or one int) + KV reads. One step's
        (`Load`) inputs are kept per (its counts, drafts, device), not its lags and remaining tokens (they
        change every step and price nothing here): counts repeat, so a live step builds no tensors."""
        if isinstance(load, Groups):
            n = load.num_requests.numpy()  # [G]
            fixed = self.cost.draft_cost(n, np.asarray(drafts)) + self.cost.context_cost(n)
            to = lambda v: torch.as_tensor(v, device=device)
            return load.group.to(device), load.num_groups, int(n.max()) if load.num_groups else 0, {
                "num_sampling": to(load.num_requests), "num_scheduled": to(load.num_requests),
                "fixed_ms": to(np.asarray(fixed, dtype=np.float64))}
        key = ((load.num_requests, load.num_sampling, load.num_scheduled_tokens), drafts, device)
        if key not in self._tables:
            fixed_ms = float(self.cost.draft_cost(load.num_requests, drafts)) if drafts else 0.0
            one = lambda v, dt: torch.tensor([v], dtype=dt, device=device)
            if len(self._tables) > 4096:  # bounded: drop the kept inputs, keep nothing stale
                self._tables = {k: v for k, v in self._tables.items() if not isinstance(k[0], tuple)}
            self._tables[key] = {"num_sampling": one(load.num_sampling, torch.int64),
                                 "num_scheduled": one(load.num_scheduled_tokens, torch.int64),
                                 "fixed_ms": one(fixed_ms + float(self.cost.context_cost(load.num_requests)),
                                                 torch.float64)}
        return single_group(rows, device), 1, load.num_scheduled_tokens, dict(self._tables[key])  # a copy: callers add

    def continue_drafting(self, batch: DraftBatch, load: Load | Groups) -> torch.Tensor | None:
        """After each pass of an autoregressive drafter: [B] bool, draft one more (plan.py `continue_drafting`;
        `batch`: the drafts so far, num_drafted == j drafted in this pass); None: no early stop."""
        if not self.stop_drafting or self.estimator is None or self.cost.drafter != "autoregressive":
            return None
        probe = self.probe() if isinstance(load, Load) else None
        if probe is not None:  # a cost probe drafts to its depth
            return batch.num_drafted < probe
        conf = self.confidences(batch)  # [B, j]
        (b, j), dev, many = conf.shape, conf.device, isinstance(load, Groups)
        group, num_groups, n, inputs = self._inputs(load, b, np.zeros(load.num_groups, np.int64) if many else 0, dev)
        active = batch.num_drafted == j  # [B] drafted in this pass
        n_active = torch.zeros(num_groups, dtype=torch.int64, device=dev).index_add_(0, group, active.long())  # [G]
        size, ran = n if many else b, n_active > 0
        passes = self._lookup("draft_pass_cost", size, dev)  # [size + 1] ms of one pass by rows
        pass_ms = passes[n_active] * ran  # [G] one pass over the active rows
        row_ms = (pass_ms - passes[(n_active - 1).clamp(min=0)]) * ran  # [G] what the last of them adds
        # the first pass also pays the drafting's fixed part (cost.py)
        self.draft_ms = pass_ms + self._lookup("draft_fixed_cost", size, dev)[n_active] * ran \
            if j == 1 or self.draft_ms is None else self.draft_ms + pass_ms
        deep = max(j, self.k)  # the look-ahead reads verify_ms up to K tokens past the optimum
        width = (n * (deep + 1) if many else n + b * deep) + deep + 2
        inputs["fixed_ms"] = inputs["fixed_ms"] + self.draft_ms
        return continue_drafting(conf, batch.num_drafted, active, group, num_groups, pass_ms=pass_ms, row_ms=row_ms,
                                 verify_ms=self._lookup("verify_cost", width, dev), max_drafts=deep, **inputs)[0]

    def observe(self, outcome: VerifyOutcome) -> None:
        self.steps += 1
        if self.estimator is None or outcome.confidences is None:
            return
        observed, label = (outcome.observed, outcome.accepted) if outcome.observed is not None else \
            observed_labels(outcome.num_verify, outcome.num_accepted, outcome.confidences.shape[1])  # [B, K]
        if outcome.cache_rows is None:
            self._learn(self.estimator, outcome, observed, label)
            return
        cache = outcome.cache_rows[:, None]  # [B, 1] each row's labels teach its drafter's estimator only
        self._learn(self.estimator, outcome, observed & ~cache, label)
        self._learn(self.cache_scorer(), outcome, observed & cache, label)

    def _learn(self, est: Estimator, outcome: VerifyOutcome, observed: torch.Tensor, label: torch.Tensor) -> None:
        """One step's labels ([B, K], where `observed`) into `est`'s round; log its refit."""
        f = _feature(outcome, est)  # [B, K]
        b, k = f.shape
        if self.kernels is not None and getattr(est, "device_round", False):
            # The round's statistics are summed on the device by the irls_stats kernel (at the
            # oriented feature and the predictions made when drafting); the estimator reads them
            # once, when the round refits.
            feat = torch.nan_to_num(f.detach().float(), nan=0.0) * est.sign
            pos = torch.arange(k, device=f.device).expand(b, k)
            stats = self.kernels.irls_stats(feat, pos, outcome.confidences.detach().float(), label.float(),
                                            observed, est.k, check=False)
            refit = est.add_round(stats)
        else:  # host estimators (forgetting_logistic's basis, batch fits, plug-ins): numpy
            observed, label = observed.cpu(), label.cpu()
            pos = torch.arange(k).expand(b, k)  # [B, K]
            refit = est.update(
                f.detach().float().cpu()[observed].numpy(), pos[observed].numpy(),
                outcome.confidences.detach().float().cpu()[observed].numpy(),
                label[observed].numpy().astype(np.float64))
        if refit:
            self._log_refit(est)

    def _log_refit(self, est: Estimator) -> None:
        cache = est is not self.estimator
        state, prefix = est.state_dict(), "cache_" if cache else ""
        refits = getattr(self, prefix + "refits") + 1
        setattr(self, prefix + "refits", refits)
        trajectory = getattr(self, prefix + "trajectory")
        trajectory.append({"step": self.steps, "refit": refits, **state})
        del trajectory[: -self.history]
        log.info("adaptive %srefit %d at step %d: %s", "cache-estimator " if cache else "", refits, self.steps,
                 {k: v for k, v in state.items() if k in ("slope", "intercepts")})


def _feature(batch: DraftBatch | VerifyOutcome, est: Estimator) -> torch.Tensor:
    """[B, K] the feature `est` reads (ConfigError when the drafter does not give it)."""
    name = estimator_feature(est)
    if name not in batch.features:
        raise ConfigError(f"adaptive policy: estimator needs feature {name!r}, the drafter gives "
                          f"{sorted(batch.features)}")
    return batch.features[name]


def make_adaptive(cost: str | CostTable | None = None, estimator: str | Estimator | None = None,
                  coefficients: str | Path = "", k: int = DEFAULT_K, adaptive: AdaptiveConfig | None = None,
                  bound: bool = False, stop_drafting: bool = False, **estimator_kwargs) -> AdaptiveVerification:
    """POLICIES["adaptive"] factory: cost table or spec, estimator name (or object) for K positions, warm start;
    other keyword arguments go to the estimator's factory. `bound`: accept a lossy estimator (the simulator's
    oracle). The suffix cache's rows get their own estimator of the same kind (`adaptive.cache_coefficients`)."""
    config = adaptive or AdaptiveConfig()
    est = estimator if estimator is not None else config.estimator
    named = isinstance(est, str)  # an estimator object keeps its own settings; the cache's gets the defaults
    cache_est = load_estimator(est if named else est.name, config.cache_coefficients, k=k, drafter="suffix",
                               **(estimator_kwargs if named else {})) if config.cache_coefficients and est is not None else None
    if named:
        est = load_estimator(est, coefficients or config.coefficients, k=k, drafter="model", **estimator_kwargs)
    if est is not None and not getattr(est, "lossless", True) and not bound:
        raise ConfigError(f"adaptive verification needs a lossless estimator; {est.name!r} reads a lossy "
                          "feature (trimming on q of the drawn token biases the output, docs/lossless.md)")
    table = resolve_cost(cost or config.cost)
    learner = CostLearner(table, probe_every=config.cost_probe_every) if config.learn_cost and est is not None \
        else None
    gate = (DraftGate(table, config, stop_drafting, k=k)
            if config.draft_gate and est is not None else None)
    return AdaptiveVerification(table, est, history=config.history, gate=gate, k=k, stop_drafting=stop_drafting,
                                name="adaptive-stop" if stop_drafting else "adaptive",
                                cache_estimator=cache_est if est is not None else None, learner=learner)


def make_adaptive_stop(**kwargs) -> AdaptiveVerification:
    """POLICIES["adaptive-stop"] factory: `make_adaptive` that also stops drafting early (plan.py)."""
    return make_adaptive(stop_drafting=True, **kwargs)

