"""Live joint routing: cache and model drafts competing for one verification budget per engine step
(HVD + Adaptive Verification; DESIGN "going beyond"; docs/hvd.md "One budget, live").

Glossary:
  cache survival  S^c[r, j] = P(cache draft of r accepted >= j), the payoff MLP's survival head on the
                  row's features; 0 past min(draft length, the engine's wanted drafts)
  model survival  S^m[r, j] from a table keyed by the row's recent model hit rate (`hist_model_hit`),
                  fitted on the replay's training requests (`model_survival_table`); 0 past wanted
  joint step      `avkit.hvd.joint_budget.joint_step`: the batch either runs the draft model (each row
                  then takes the draft with the larger expected accepted length) or does not (cache
                  drafts only); each option's slots are planned by scheduling/plan.py (one group,
                  b* = argmax E(b) / cost(b)) and the option with the larger E - lambda cost wins,
                  lambda the router's running rate of planned tokens per cost (`RunningRate`)
  limit           per row, how many drafts to propose: the plan's verified prefix. The model drafter
                  is asked for exactly that many, so a doubtful model row costs no draft passes
  catch-up        the draft model follows a request only while it drafts for it; the first model draft
                  prefills its prompt, a later one what it missed (`HvdCost.catch_up`, the profiled
                  prefill curve): priced in the model option, which also runs without the rows needing one
Costs are the replay's (`HvdCost`, in target forwards), written into payoff_survival.pt by
`avkit hvd`, so the live plan and the replay's predictions use the same cost model.
Lossless: every input (features of the context and the deterministic cache draft, the hit history
of verified steps, the costs) is fixed before the model draws anything, so the limits never
depend on this step's draws (docs/lossless.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from avkit.errors import ConfigError
from avkit.hvd.cost import HvdCost
from avkit.hvd.features import feature_matrix
from avkit.hvd.joint_budget import RunningRate, joint_step
from avkit.hvd.payoff_mlp import PayoffMLP


@dataclass(frozen=True)
class JointRouter:
    payoff: PayoffMLP  # survival head
    model_surv: np.ndarray  # [bins + 1, K] P(model accepted >= j | hit-rate bin)
    hit_bins: np.ndarray  # [bins] inner edges of the hit-rate bins
    cost: HvdCost = HvdCost()
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
        cost = HvdCost.from_json(extra.get("cost", {}))
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


__all__ = ["JointRouter"]
