"""Adaptive verification: the budgeted verify policy with live estimator refits (docs/estimator.md, docs/budget.md).

Glossary:
  confidence   c[r, j] = estimator.predict(feature[r, j], j), a lossless feature of the draft
               distribution only (never q of the drawn token), so trimming stays lossless
  budget       b* = argmax_b E(b) / cost(b) over the batch's slots ranked by survival (budget.py)
  observed     slot j of request r carries a label iff j < num_verify[r] (verified) and
               j <= num_accepted[r] (at or before the first rejection); label = j < num_accepted[r].
               Trimmed slots and slots after the first rejection are censored: no label.
  refit round  the estimator accumulates statistics every step and refits every N steps; after each
               refit the policy appends the coefficients to `trajectory` and logs them.
  draft gate   before drafting, `draft_this_step` may skip speculation for the step when no draft depth
               pays at its load, judged from earlier steps (gate.py); the engine then decodes target-only
  stop early   an autoregressive drafter pays one forward per depth, which trimming cannot refund;
               `continue_drafting` (called by the drafter after each pass, optional) stops a request's
               drafting once its next draft would not pay for itself (the simulator's `adaptive-stop`)
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
from avkit.scheduling.budget import Allocation, plan_verification
from avkit.scheduling.cost import CostTable, resolve_cost
from avkit.scheduling.gate import DraftGate
from avkit.scheduling.policy import DraftBatch, Load, VerifyOutcome

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
class AdaptiveVerification:
    """Verify each request's drafts up to the survival-ranked budget that maximizes tokens per ms."""

    cost: CostTable
    estimator: Estimator | None
    history: int = 1000  # refits kept in `trajectory`
    name: str = "adaptive"
    last_confidences: torch.Tensor | None = None  # [B, K] predictions of the last num_verify call
    last_allocation: Allocation | None = None
    trajectory: list[dict] = field(default_factory=list)  # {"step", "refit", **estimator.state_dict()}
    steps: int = 0
    refits: int = 0
    draft_ms: float | None = None  # drafting paid this step, when the drafter asks `continue_drafting`
    gate: DraftGate | None = None  # skips drafting for a step when it cannot pay (None: always draft)
    k: int = DEFAULT_K  # positions the estimator predicts (the width of the gate's rows)

    def confidences(self, batch: DraftBatch) -> torch.Tensor:
        """[B, K] acceptance predictions from the estimator's feature; 0 past num_drafted."""
        name = estimator_feature(self.estimator)
        if name not in batch.features:
            raise ConfigError(f"adaptive policy: estimator needs feature {name!r}, the drafter gives "
                              f"{sorted(batch.features)}")
        f = batch.features[name]  # [B, K]
        b, k = f.shape
        feats = torch.nan_to_num(f.detach().float(), nan=0.0).cpu().numpy().reshape(-1)  # [B*K]
        pos = np.tile(np.arange(k), b)  # [B*K] position of each slot
        pred = np.asarray(self.estimator.predict(feats, pos), dtype=np.float32).reshape(b, k)
        return torch.from_numpy(pred).to(f.device)

    def first_predictions(self, batch: DraftBatch, k: int) -> np.ndarray:
        """[B, k] every position j < k predicted from each request's position-0 feature."""
        f = batch.features[estimator_feature(self.estimator)]  # [B, K]
        b = f.shape[0]
        f0 = torch.nan_to_num(f[:, :1].detach().float(), nan=0.0).expand(b, k).cpu().numpy().reshape(-1)
        pos = np.tile(np.arange(k), b)  # [B*k]
        return np.asarray(self.estimator.predict(f0, pos), dtype=np.float32).reshape(b, k)

    def sizing(self, batch: DraftBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw-independent inputs that size b*: every position j of request r predicted from r's
        position-0 feature (q_0 depends on the prefix only) with position j's coefficients, and K
        nominal drafts for every request that drafted. Live features at j >= 1 are functions of the
        drawn x_0..x_{j-1}; letting them move b* would make k_r >= 1 depend on x_0 (lossy)."""
        k = batch.features[estimator_feature(self.estimator)].shape[1]
        pred = self.first_predictions(batch, k)
        nominal = torch.where(batch.num_drafted.cpu() > 0, k, 0)  # [B]
        return torch.from_numpy(pred), nominal

    def draft_this_step(self, load: Load) -> bool:
        """Before drafting: False skips speculation for this step (the gate; always True without one)."""
        return self.gate is None or self.estimator is None or self.gate.draft_this_step(load.num_requests)

    def num_verify(self, batch: DraftBatch, load: Load) -> torch.Tensor:
        if self.estimator is None:
            self.last_confidences = None
            return batch.num_drafted.clone()
        conf = self.confidences(batch)  # [B, K]
        self.draft_ms = None  # size with the nominal drafting cost: the passes run depend on the draws
        sizing = self.sizing(batch)
        plan = self._plan(conf, batch.num_drafted, load, sizing=sizing)
        self.last_confidences, self.last_allocation, self.draft_ms = conf, plan, None
        if self.gate is not None:  # the gate's curve spans all K positions, even when fewer were drafted
            full = sizing[0].numpy() if conf.shape[1] == self.k else self.first_predictions(batch, self.k)
            self.gate.observe(full[batch.num_drafted.cpu().numpy() > 0])
        return plan.num_verify.to(batch.num_drafted.device)

    def _plan(self, conf: torch.Tensor, num_drafted: torch.Tensor, load: Load, sizing=None) -> Allocation:
        # Drafting is paid before verification: K passes over the batch, or what continue_drafting counted.
        draft_ms = self.draft_ms if self.draft_ms is not None else float(
            self.cost.draft_cost(load.num_requests, conf.shape[1]))
        return plan_verification(
            conf, num_drafted.cpu(), num_sampling=load.num_sampling, num_scheduled=load.num_scheduled_tokens,
            fixed_ms=draft_ms + float(self.cost.context_cost(load.num_requests)), verify_ms=self.cost.verify_cost,
            sizing=sizing)

    def continue_drafting(self, batch: DraftBatch, load: Load) -> torch.Tensor:
        """For an autoregressive drafter, after each pass: which requests should draft one more token ([B] bool).

        `batch` holds the drafts so far (features [B, j], num_drafted [B]); requests with num_drafted == j
        drafted in this pass. A request goes on only if the budget sized now (drafting so far paid)
        verifies its newest draft and the next one pays for itself at the step's current rate:
        s_next = s_newest * c_newest > rate * (pass_ms / n_active + marginal verify ms). Lossless: only q's
        shape and the load decide. Call `num_verify` after the last pass (it resets the count).
        """
        conf = self.confidences(batch)  # [B, j]
        j = conf.shape[1]
        drafted = batch.num_drafted.cpu()
        active = drafted == j  # [B] drafted in this pass
        n_active = int(active.sum())
        pass_ms = float(self.cost.draft_cost(n_active, 1)) if n_active else 0.0
        self.draft_ms = (0.0 if j == 1 or self.draft_ms is None else self.draft_ms) + pass_ms
        plan = self._plan(conf, drafted, load)
        rate = plan.expected_tokens / plan.cost_ms  # tokens per ms at the optimum
        t = load.num_scheduled_tokens + plan.budget
        marginal = pass_ms / max(n_active, 1) + float(np.diff(self.cost.verify_cost([t, t + 1]))[0])
        rows = torch.arange(conf.shape[0])
        newest = (drafted - 1).clamp(min=0)
        s_next = plan.survival[rows, newest] * conf.cpu()[rows, newest].clamp(0, 1)  # [B] guess of s at j
        keep = active & (plan.num_verify == drafted) & (s_next > rate * marginal)
        return keep.to(batch.num_drafted.device)

    def observe(self, outcome: VerifyOutcome) -> None:
        self.steps += 1
        if self.estimator is None or outcome.confidences is None:
            return
        f = outcome.features[estimator_feature(self.estimator)]  # [B, K]
        b, k = f.shape
        observed, label = observed_labels(outcome.num_verify.cpu(), outcome.num_accepted.cpu(), k)
        pos = torch.arange(k).expand(b, k)  # [B, K]
        refit = self.estimator.update(
            f.detach().float().cpu()[observed].numpy(), pos[observed].numpy(),
            outcome.confidences.detach().float().cpu()[observed].numpy(), label[observed].numpy().astype(np.float64))
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

