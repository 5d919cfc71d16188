"""Draft gate: whether a step drafts at all, the adaptive policy's choice of no speculation.

The budget (budget.py) and the early stop (adaptive.py `continue_drafting`) decide after drafting has
started, so they can shorten speculation but never drop it; when the drafter's forward costs a large
share of a target forward and verification is compute-bound (a CPU at concurrency 16), target-only
decoding wins and only a decision taken before drafting can pick it.
Glossary:
  mean survival  s[j] = running mean, over recent drafted request-steps, of the sizing survival
                 prod_{i<=j} c(f_0, i): each request's position-0 feature predicted at every position,
                 exactly the draw-independent inputs that size b* (adaptive.py `sizing`)
  window         the running mean forgets with a horizon of `window` request-steps: a drafted step of
                 B requests moves it by alpha = 1 - (1 - 1/window)^B (the first one sets it)
  depth rate     mean field, n requests each drafting and verifying d tokens:
                 rate(d) = n (1 + sum_{j<d} s[j]) / (draft_ms(n, d) + context_ms(n) + verify_ms(n + n d))
  gate           while drafting: draft this step iff argmax_d rate(d) >= 1 (ties -> the smaller d); a
                 skipped step runs target-only decoding: one target token per request, nothing drafted,
                 nothing observed
  catch-up       the draft model's KV cache does not see the tokens decoded while drafting is off; the
                 first drafted step after a pause feeds them to the drafter (a prefill of every stale
                 token), a cost the step-rate comparison does not see. Hence:
  hysteresis     while off, drafting resumes only if max_d rate(d) > (1 + `resume_margin`) rate(0)
  probe          after `probe_every` skipped steps in a row the next step drafts anyway, so that s
                 follows the traffic while speculation is off (rare: each probe pays a catch-up)
Lossless: the decision reads the load and earlier steps' features only (prefixes already emitted,
drafts of steps that are over), never this step's draws; each emitted token still follows the target
given everything before it, so the output does (DESIGN.md §2).
Used live by AdaptiveVerification (`draft_this_step`) and by the simulator (sim/policies.py) alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from avkit.scheduling.cost import CostTable
from avkit.validate import check_range


def mean_survival(conf: np.ndarray) -> np.ndarray:
    """[B, K] confidences -> [K] mean over rows of the survival prod_{i<=j} c[r, i]."""
    return np.cumprod(np.clip(np.nan_to_num(np.asarray(conf, dtype=np.float64), nan=0.0), 0.0, 1.0), axis=1).mean(0)


def depth_rates(survival: np.ndarray, num_requests: int, cost: CostTable) -> np.ndarray:
    """[K+1] mean-field tokens per ms when every request drafts and verifies d = 0..K tokens."""
    d = np.arange(survival.size + 1)  # [K+1]
    tokens = num_requests * (1.0 + np.r_[0.0, np.cumsum(survival)])  # [K+1] expected tokens per step
    ms = (cost.draft_cost(num_requests, d) + cost.context_cost(num_requests)
          + cost.verify_cost(num_requests * (1 + d)))  # [K+1]
    return tokens / ms


def best_depth(survival: np.ndarray, num_requests: int, cost: CostTable) -> int:
    """argmax over d in 0..K of the mean-field depth rate (module note); ties -> the smaller d."""
    return int(np.argmax(depth_rates(survival, num_requests, cost)))


@dataclass
class DraftGate:
    """Skip drafting while, at this step's load, no draft depth pays for itself on the cost table."""

    cost: CostTable
    window: int = 64  # request-steps in the running mean of the survival curve
    probe_every: int = 256  # skipped steps in a row before a probing drafted step
    resume_margin: float = 0.1  # while off, resume drafting only for a predicted gain above this
    survival: np.ndarray | None = None  # [K] mean sizing survival (None until a step drafted)
    skipped: int = 0  # consecutive skipped steps
    skipped_total: int = 0
    steps: int = 0  # steps asked about

    def __post_init__(self):
        check_range("gate_window", self.window, 1)
        check_range("probe_every", self.probe_every, 1)
        check_range("resume_margin", self.resume_margin, 0.0)

    def draft_this_step(self, num_requests: int) -> bool:
        """Ask once per step, before drafting; counts skipped steps and schedules probes."""
        self.steps += 1
        if self.survival is None or self.skipped >= self.probe_every or num_requests < 1:
            draft = True
        else:
            rate = depth_rates(self.survival, num_requests, self.cost)  # [K+1]
            d = int(np.argmax(rate))
            draft = d > 0 and bool(self.skipped == 0 or rate[d] > (1.0 + self.resume_margin) * rate[0])
        self.skipped = 0 if draft else self.skipped + 1
        self.skipped_total += not draft
        return draft

    def observe(self, sizing_conf: np.ndarray) -> None:
        """Fold a drafted step's sizing confidences ([B, K], rows that drafted) into the running mean."""
        if sizing_conf.shape[0]:
            self.fold(mean_survival(sizing_conf), sizing_conf.shape[0])

    def fold(self, s: np.ndarray, b: int) -> None:
        """Fold a step's mean survival s [K] over b drafted requests into the running mean."""
        if self.survival is None or self.survival.shape != s.shape:
            self.survival = s
            return
        alpha = 1.0 - (1.0 - 1.0 / self.window) ** b
        self.survival = (1.0 - alpha) * self.survival + alpha * s

    def state(self) -> tuple:
        """What the next decisions depend on (the simulator rewinds to it when a round re-predicts)."""
        return (None if self.survival is None else self.survival.copy(), self.skipped, self.skipped_total, self.steps)

    def restore(self, state: tuple) -> None:
        self.survival, self.skipped, self.skipped_total, self.steps = state

    def replay(self, num_requests: np.ndarray, survival: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, list]:
        """Steps in order, as the simulator runs them: requests [G], each step's mean sizing survival
        [G, K] over its `rows` [G] drafting requests -> (drafted [G] bool, state before each step [G]).
        One iteration per step (the running mean is sequential), none per request or slot."""
        on, states = np.zeros(len(num_requests), dtype=bool), []
        for g, n in enumerate(num_requests.tolist()):
            states.append(self.state())
            on[g] = self.draft_this_step(n)
            if on[g] and rows[g]:
                self.fold(survival[g], int(rows[g]))
        return on, states

