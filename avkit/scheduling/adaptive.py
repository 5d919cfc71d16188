"""Adaptive verification: the budgeted verify policy with live estimator refits (DESIGN.md §3-4).

Glossary:
  confidence   c[r, j] = estimator.predict(feature[r, j], j), a lossless feature of the draft
               distribution only (never q of the drawn token), so trimming stays lossless
  budget       b* = argmax_b E(b) / cost(b) over the batch's slots ranked by survival (budget.py)
  observed     slot j of request r carries a label iff j < num_verify[r] (verified) and
               j <= num_accepted[r] (at or before the first rejection); label = j < num_accepted[r].
               Trimmed slots and slots after the first rejection are censored: no label.
  refit round  the estimator accumulates statistics every step and refits every N steps; after each
               refit the policy appends the coefficients to `trajectory` and logs them.
Registered in POLICIES as `adaptive`. With estimator "none" it verifies every draft (the `full` policy).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import avkit.estimators  # noqa: F401  (registers the estimators)
from avkit.config import DEFAULT_K, AdaptiveConfig
from avkit.errors import AvkitError, ConfigError
from avkit.estimators.base import ESTIMATORS, Estimator, make_estimator
from avkit.scheduling.budget import Allocation, plan_verification
from avkit.scheduling.cost import CostTable, resolve_cost
from avkit.scheduling.policy import POLICIES, DraftBatch, Load, VerifyOutcome

log = logging.getLogger("avkit.adaptive")

DEFAULT_FEATURE = "logit_qmax"


def observed_labels(num_verify: torch.Tensor, num_accepted: torch.Tensor, k: int):
    """DESIGN.md §3 labels: (observed [B, K] bool, label [B, K] bool); label is meaningful where observed."""
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


def load_estimator(name: str, coefficients: str | Path = "", k: int = DEFAULT_K, **kwargs) -> Estimator | None:
    """An estimator from the registry (K positions), warm-started from a coefficients.json if given.

    "none" -> None (full verification); "online" is short for "online_logistic". The warm start goes
    through the estimator's `load_state_dict` (the JSON's `state` entry when it has one).
    """
    name = ALIASES.get(name, name)
    if name == "none":
        return None
    if name not in ESTIMATORS:
        raise ConfigError(f"unknown estimator {name!r}; choose from {sorted([*ESTIMATORS, *ALIASES, 'none'])}")
    estimator = make_estimator(name, k=k, **kwargs)
    if not coefficients:
        return estimator
    path = Path(coefficients).expanduser()
    if not path.is_file():
        raise ConfigError(f"coefficients: no such file: {path}")
    try:
        state = json.loads(path.read_text())
        estimator.load_state_dict(state.get("state", state))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError, AvkitError) as e:
        raise ConfigError(f"coefficients {path}: cannot warm-start {name!r} from it ({type(e).__name__}: {e})") from None
    return estimator


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

    def num_verify(self, batch: DraftBatch, load: Load) -> torch.Tensor:
        if self.estimator is None:
            self.last_confidences = None
            return batch.num_drafted.clone()
        conf = self.confidences(batch)  # [B, K]
        k_drafted = conf.shape[1]  # the drafter ran K passes whatever we verify
        plan = plan_verification(
            conf, batch.num_drafted, num_sampling=load.num_sampling, num_scheduled=load.num_scheduled_tokens,
            fixed_ms=float(self.cost.fixed_cost(load.num_requests, k_drafted)), verify_ms=self.cost.verify_cost)
        self.last_confidences, self.last_allocation = conf, plan
        return plan.num_verify.to(batch.num_drafted.device)

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
    return AdaptiveVerification(resolve_cost(cost or config.cost), est, history=config.history)


POLICIES["adaptive"] = make_adaptive
