"""Adaptive verification: the budgeted verify policy with live estimator refits (docs/estimator.md, docs/budget.md).

Glossary:
  confidence   c[r, j] = estimator.predict(feature[r, j], j), a lossless feature of the draft
               distribution only (never q of the drawn token), so trimming stays lossless
  budget       b* = argmax_b E(b) / cost(b) over the batch's slots ranked by survival (plan.py, one group)
  observed     slot j of request r carries a label iff j < num_verify[r] (verified) and
               j <= num_accepted[r] (at or before the first rejection); label = j < num_accepted[r].
               Trimmed slots and slots after the first rejection are censored: no label.
  refit round  the estimator accumulates statistics every step and refits every N steps; after each
               refit the policy appends the coefficients to `trajectory` and logs them.
  draft gate   before drafting, `draft_this_step` may skip speculation for the step when no draft depth
               pays at its load, judged from earlier steps (gate.py); the engine then decodes target-only
  stop early   an autoregressive drafter pays one forward per depth, which trimming cannot refund;
               `continue_drafting` (called by the drafter after each pass) stops a request's drafting
               once its next draft would not pay for itself (stop.py; the simulator's `adaptive-stop`)
Registered in POLICIES as `adaptive`. With estimator "none" it verifies every draft (the `full` policy).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from avkit.config import DEFAULT_K, AdaptiveConfig, EstimatorConfig
from avkit.errors import AvkitError, ConfigError
from avkit.estimators.base import ESTIMATORS, Estimator, make_estimator
from avkit.estimators.coefficients import ServedPair, load_coefficients
from avkit.kernels.dispatch import Kernels
from avkit.scheduling.cost import CostTable, resolve_cost
from avkit.scheduling.gate import DraftGate
from avkit.scheduling.plan import Plan, plan, single_group, verify_lookup
from avkit.scheduling.policy import VerifyPolicy
from avkit.scheduling.stop import continue_drafting
from avkit.step_types import DraftBatch, Load, StepPlan, VerifyOutcome

log = logging.getLogger("avkit.adaptive")

DEFAULT_FEATURE = "logit_qmax"


def observed_labels(num_verify: torch.Tensor, num_accepted: torch.Tensor, k: int):
    """docs/estimator.md labels: (observed [B, K] bool, label [B, K] bool); label is meaningful where observed."""
    j = torch.arange(k, device=num_verify.device)[None, :]  # [1, K]
    observed = (j < num_verify[:, None]) & (j <= num_accepted[:, None])  # [B, K]
    return observed, j < num_accepted[:, None]


# Estimators that use a probability-valued feature as is, and the feature they read.
PROBABILITY_FEATURES = {"qmax": "q_max", "passthrough": "head_conf"}
ALIASES = {"online": "online_logistic", "batch": "batch_logistic"}


def estimator_feature(estimator: Estimator) -> str:
    """The DraftBatch feature an estimator reads: its `feature`, its config's, or its no-fit input."""
    if hasattr(estimator, "feature"):
        return str(estimator.feature)
    if hasattr(getattr(estimator, "config", None), "feature"):
        return str(estimator.config.feature)
    return PROBABILITY_FEATURES.get(getattr(estimator, "name", ""), DEFAULT_FEATURE)


def load_estimator(name: str, coefficients: str | Path = "", k: int = DEFAULT_K, pair: ServedPair | None = None,
                   **kwargs) -> Estimator | None:
    """An estimator from the registry (K positions), warm-started from a coefficients file if given.

    "none" -> None (full verification); "online" is short for "online_logistic". The file goes through
    the one validated loader (estimators/coefficients.py: K, finiteness, feature, the served `pair`)
    and then the estimator's `load_state_dict`. A file written by `forgetting_logistic` (two basis
    slopes) or `per_position_slope` loads only into that estimator; a shared-slope file into any.
    """
    name = ALIASES.get(name, name)
    if name == "none":
        return None
    if name not in ESTIMATORS:
        raise ConfigError(f"unknown estimator {name!r}; choose from {sorted([*ESTIMATORS, *ALIASES, 'none'])}")
    if not coefficients:
        return make_estimator(name, k=k, **kwargs)
    path = Path(coefficients).expanduser()
    if not path.is_file():
        raise ConfigError(f"coefficients: no such file: {path}")
    state = load_coefficients(path, k=k, pair=pair)
    written_by = state.get("estimator", state.get("name", "online_logistic"))
    if written_by in OWN_FILES and written_by != name:
        raise ConfigError(f"coefficients {path}: field 'estimator' is {written_by!r}; its coefficients load "
                          f"only into {written_by!r}, not {name!r}")
    feature = state.get("feature")
    if feature and "config" not in kwargs and feature != EstimatorConfig().feature:
        kwargs["config"] = EstimatorConfig(feature=feature)  # the fitted file names its feature
    estimator = make_estimator(name, k=k, **kwargs)
    if feature and estimator_feature(estimator) != feature:
        raise ConfigError(f"coefficients {path}: field 'feature' is {feature!r}, estimator {name!r} reads "
                          f"{estimator_feature(estimator)!r}")
    try:
        estimator.load_state_dict(state)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError, AvkitError) as e:
        raise ConfigError(f"coefficients {path}: cannot warm-start {name!r} from it ({e})") from None
    return estimator


OWN_FILES = ("forgetting_logistic", "per_position_slope")  # files only their own estimator can load


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
    draft_ms: torch.Tensor | None = None  # [1] drafting paid this step, summed by `continue_drafting`
    gate: DraftGate | None = None  # skips drafting for a step when it cannot pay (None: always draft)
    k: int = DEFAULT_K  # positions the estimator predicts (the width of the gate's rows)
    last_plan: Plan | None = None  # the plan of the last num_verify call (one group)
    kernels: Kernels | None = None  # the engine's kernel set: the plan's prefixes by its allocation kernel
    _tables: dict = field(default_factory=dict, repr=False)  # (kind, device) -> cost lookup tables

    def confidences(self, batch: DraftBatch) -> torch.Tensor:
        """[B, K] acceptance predictions: the confidence kernel's (computed in the draft pass) or the
        estimator's from its feature; on the features' device."""
        if batch.confidences is not None:
            return batch.confidences
        name = estimator_feature(self.estimator)
        if name not in batch.features:
            raise ConfigError(f"adaptive policy: estimator needs feature {name!r}, the drafter gives "
                              f"{sorted(batch.features)}")
        f = batch.features[name]  # [B, K]
        return self._predict(f, torch.arange(f.shape[1], device=f.device).expand(f.shape))

    def _predict(self, f: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[B, K] float32 predictions (NaN features read as 0), on the device: no host read."""
        f = torch.nan_to_num(f.detach().float(), nan=0.0)  # [B, K]
        if hasattr(self.estimator, "predict_torch"):
            return self.estimator.predict_torch(f, positions).float()
        # A plug-in estimator without a device path predicts in numpy (a host read per call).
        pred = self.estimator.predict(f.cpu().numpy().reshape(-1), positions.cpu().numpy().reshape(-1))
        return torch.as_tensor(np.asarray(pred, dtype=np.float32)).reshape(f.shape).to(f.device)

    def first_predictions(self, batch: DraftBatch, k: int) -> torch.Tensor:
        """[B, k] every position j < k predicted from each request's position-0 feature."""
        f = batch.features[estimator_feature(self.estimator)]  # [B, K]
        b = f.shape[0]
        return self._predict(f[:, :1].expand(b, k), torch.arange(k, device=f.device).expand(b, k))

    def confidence_coefficients(self, device):
        """(slope [1], intercepts [K]) for the confidence kernel in the draft pass, or None."""
        est = self.estimator
        return None if est is None or not hasattr(est, "kernel_coefficients") else est.kernel_coefficients(device)

    def sizing(self, batch: DraftBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw-independent inputs that size b*: every position j of request r predicted from r's
        position-0 feature (q_0 depends on the prefix only) with position j's coefficients, and K
        nominal drafts for every request that drafted. Live features at j >= 1 are functions of the
        drawn x_0..x_{j-1}; letting them move b* would make k_r >= 1 depend on x_0 (lossy)."""
        k = batch.features[estimator_feature(self.estimator)].shape[1]
        return self.first_predictions(batch, k), torch.where(batch.num_drafted > 0, k, 0)

    def use_kernels(self, kernels: Kernels) -> None:
        self.kernels = kernels

    def draft_this_step(self, load: Load) -> bool:
        """Before drafting: False skips speculation for this step (the gate; always True without one)."""
        return self.gate is None or self.estimator is None or self.gate.draft_this_step(load.num_requests)

    def num_verify(self, batch: DraftBatch, load: Load) -> StepPlan:
        if self.estimator is None:
            return StepPlan(batch.num_drafted.clone(), None)
        conf = self.confidences(batch)  # [B, K]
        self.draft_ms = None  # size with the nominal drafting cost: the passes run depend on the draws
        sizing = self.sizing(batch)
        plan = self._plan(conf, batch.num_drafted, load, sizing=sizing)
        self.last_plan, self.draft_ms = plan, None
        if self.gate is not None:  # the gate's curve spans all K positions, even when fewer were drafted
            full = sizing[0] if conf.shape[1] == self.k else self.first_predictions(batch, self.k)
            self.gate.observe(full[batch.num_drafted > 0])
        return StepPlan(plan.num_verify, conf)

    def _lookup(self, kind: str, size: int, device) -> torch.Tensor:
        """Cost lookup table by count on `device`, built on the host once (grown when a step needs more)."""
        table = self._tables.get((kind, device))
        if table is None or table.numel() <= size:
            fn = self.cost.verify_cost if kind == "verify" else (lambda n: self.cost.draft_cost(n, 1))
            table = verify_lookup(fn, max(2 * size, 64), device)
            self._tables[(kind, device)] = table
        return table

    def _group_inputs(self, load: Load, fixed_ms: float, device) -> dict:
        one = lambda v, dt: torch.tensor([v], dtype=dt, device=device)
        return {"num_sampling": one(load.num_sampling, torch.int64),
                "num_scheduled": one(load.num_scheduled_tokens, torch.int64),
                "fixed_ms": one(fixed_ms + float(self.cost.context_cost(load.num_requests)), torch.float64)}

    def _plan(self, conf: torch.Tensor, num_drafted: torch.Tensor, load: Load, sizing=None) -> Plan:
        # Drafting is paid before verification: K passes over the batch (nominal, the draws decide the rest).
        b, k = conf.shape
        dev = conf.device
        verify_ms = self._lookup("verify", load.num_scheduled_tokens + b * max(k, self.k) + 1, dev)
        draft_ms = float(self.cost.draft_cost(load.num_requests, k))
        return plan(conf, num_drafted, single_group(b, dev), 1, verify_ms=verify_ms, sizing=sizing,
                    allocate=None if self.kernels is None else self.kernels.allocate,
                    **self._group_inputs(load, draft_ms, dev))

    def continue_drafting(self, batch: DraftBatch, load: Load) -> torch.Tensor:
        """For an autoregressive drafter, after each pass: which requests should draft one more token ([B] bool).

        `batch` holds the drafts so far (features [B, j], num_drafted [B]); requests with num_drafted == j
        drafted in this pass. The rule is scheduling/stop.py's, with the drafting paid so far summed
        on the device (no host read). Call `num_verify` after the last pass.
        """
        conf = self.confidences(batch)  # [B, j]
        b, j = conf.shape
        dev = conf.device
        active = batch.num_drafted == j  # [B] drafted in this pass
        n_active = active.sum().reshape(1)  # [1]
        pass_ms = self._lookup("draft", b, dev)[n_active] * (n_active > 0)  # [1] one pass over the active rows
        paid = pass_ms if j == 1 or self.draft_ms is None else self.draft_ms + pass_ms
        self.draft_ms = paid
        verify_ms = self._lookup("verify", load.num_scheduled_tokens + b * max(j, self.k) + 2, dev)
        inputs = self._group_inputs(load, 0.0, dev)
        inputs["fixed_ms"] = inputs["fixed_ms"] + paid
        keep, _ = continue_drafting(conf, batch.num_drafted, active, single_group(b, dev), 1, pass_ms=pass_ms,
                                    n_active=n_active, verify_ms=verify_ms, **inputs)
        return keep

    def observe(self, outcome: VerifyOutcome) -> None:
        self.steps += 1
        if self.estimator is None or outcome.confidences is None:
            return
        est = self.estimator
        f = outcome.features[estimator_feature(est)]  # [B, K]
        b, k = f.shape
        if self.kernels is not None and getattr(est, "device_round", False):
            # The round's statistics are summed on the device by the irls_stats kernel (at the
            # oriented feature and the predictions made when drafting); the estimator reads them
            # once, when the round refits.
            observed, label = observed_labels(outcome.num_verify, outcome.num_accepted, k)  # [B, K]
            feat = torch.nan_to_num(f.detach().float(), nan=0.0) * est.sign
            pos = torch.arange(k, device=f.device).expand(b, k)
            stats = self.kernels.irls_stats(feat, pos, outcome.confidences.detach().float(), label.float(),
                                            observed, est.k, check=False)
            refit = est.add_round(stats)
        else:  # host estimators (forgetting_logistic's basis, batch fits, plug-ins): numpy
            observed, label = observed_labels(outcome.num_verify.cpu(), outcome.num_accepted.cpu(), k)
            pos = torch.arange(k).expand(b, k)  # [B, K]
            refit = est.update(
                f.detach().float().cpu()[observed].numpy(), pos[observed].numpy(),
                outcome.confidences.detach().float().cpu()[observed].numpy(),
                label[observed].numpy().astype(np.float64))
        if refit:
            self._log_refit()

    def _log_refit(self):
        self.refits += 1
        state = self.estimator.state_dict()
        self.trajectory.append({"step": self.steps, "refit": self.refits, **state})
        del self.trajectory[: -self.history]
        log.info("adaptive refit %d at step %d: %s", self.refits, self.steps,
                 {k: v for k, v in state.items() if k in ("slope", "intercepts")})


def make_adaptive(cost: str | CostTable | None = None, estimator: str | Estimator | None = None,
                  coefficients: str | Path = "", k: int = DEFAULT_K, adaptive: AdaptiveConfig | None = None,
                  **estimator_kwargs) -> AdaptiveVerification:
    """POLICIES["adaptive"] factory: cost table or spec, estimator name (or object) for K positions, warm start.

    Other keyword arguments go to the estimator's factory (e.g. `config=EstimatorConfig(...)`).
    """
    config = adaptive or AdaptiveConfig()
    est = estimator if estimator is not None else config.estimator
    if isinstance(est, str):
        est = load_estimator(est, coefficients or config.coefficients, k=k, **estimator_kwargs)
    if est is not None and not getattr(est, "lossless", True):
        raise ConfigError(f"adaptive verification needs a lossless estimator; {est.name!r} reads a lossy "
                          "feature (trimming on q of the drawn token biases the output, docs/lossless.md)")
    table = resolve_cost(cost or config.cost)
    gate = (DraftGate(table, config.gate_window, config.probe_every, config.resume_margin, k=k)
            if config.gate and est is not None else None)
    return AdaptiveVerification(table, est, history=config.history, gate=gate, k=k)

