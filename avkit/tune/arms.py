"""Arms: the deployments `avkit tune` compares, each replayed by the simulator (sim/drive.py runs the engine's
policy object) at each concurrency.

  arm        a policy spec and the most drafts per step K: nospec, fixed K, adaptive K (draft up to K, the
             budget sizes verification) or adaptive-stop K (also stops drafting early)
  cell       one arm at one concurrency: the simulator's metrics row, and per recorded request its tokens
             and time share (step ms / requests in the step, summed over its copies), per request copy
             its TPOT (decode only, copies that ran whole inside the steady-state window)
  truncated  traces as if recorded with at most K drafts (labels past K dropped, accepted min(a, K)): exact
             under the simulator's min(k, a) replay
An arm that drafts also pays the drafter's prompt prefill (prefill.py) per output token; `decode_tok_s` keeps
the decode-only rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from avkit.scheduling.cost import CostTable
from avkit.scheduling.spec import PolicySpec, parse_spec
from avkit.sim.drive import SimPolicy, decide
from avkit.sim.replay import accepted_drafts, policy_metrics, step_times
from avkit.sim.steps import Replay, StepTable, schedule


@dataclass(frozen=True)
class Arm:
    kind: str  # a policy spec's head: nospec, fixed, adaptive or adaptive-stop
    k: int  # drafts per request and step at most (0 for nospec)

    def __post_init__(self):
        self.spec("online_logistic", True)  # one error line for a head that names no policy
        assert (self.k == 0) == (self.kind == "nospec"), self

    @property
    def name(self) -> str:
        if self.kind == "nospec":
            return "nospec"
        return f"fixed{self.k}" if self.kind == "fixed" else f"{self.kind}-K{self.k}"

    def spec(self, estimator: str, gate: bool) -> PolicySpec:
        """The arm's policy spec, with tune's estimator and draft gate for adaptive arms."""
        if self.kind in ("nospec", "fixed"):
            return parse_spec(f"fixed:{self.k}", "arm")
        return parse_spec(f"{self.kind}{'' if gate else '-nogate'}:{estimator}", "arm")


@dataclass(frozen=True)
class Cell:
    arm: Arm
    concurrency: int
    metrics: dict  # the simulator's row (avkit/sim/replay.py RESULT_COLUMNS, less the vs_* ratios)
    tokens: np.ndarray  # [R] tokens emitted per recorded request (all its copies in the window)
    time_ms: np.ndarray  # [R] its share of the window's step time
    p90_tpot_ms: float  # 90th percentile over request copies of ms per output token

    @property
    def throughput(self) -> float:
        return float(self.metrics["throughput_tok_s"])

    def meets(self, slo_ms: float) -> bool:
        """Its p90 TPOT keeps the SLO (0: no SLO)."""
        return slo_ms <= 0 or self.p90_tpot_ms <= slo_ms


def truncate(steps: StepTable, k: int) -> StepTable:
    """The traces as if recorded with at most `k` drafts per step (see the glossary)."""
    if k >= steps.k:
        return steps
    return replace(steps, drafted=np.minimum(steps.drafted, k), verified=np.minimum(steps.verified, k),
                   accepted=np.minimum(steps.accepted, k), label=steps.label[:, :k].copy(),
                   features={n: v[:, :k].copy() for n, v in steps.features.items()}, k=k)


def _cell(arm: Arm, replay: Replay, policy: SimPolicy, prefill: np.ndarray | None) -> Cell:
    k_verify, drafted, draft_ms = decide(policy.make(replay.steps, replay.cost), replay)
    metrics = policy_metrics(replay, policy, k_verify, drafted, draft_ms)
    steps, sched = replay.steps, replay.sched
    step_ms = step_times(replay, k_verify, draft_ms)  # [G]
    tokens = accepted_drafts(replay, k_verify) + 1  # [S'] accepted + bonus per request-step
    share = (step_ms / replay.num_requests)[sched.group]  # [S'] the lanes share each step
    source = steps.request[sched.rows]  # [S'] recorded request of each row
    r = steps.num_requests
    per_copy_ms = np.bincount(sched.copy, weights=step_ms[sched.group])  # [C] a request waits for its whole step
    per_copy_tok = np.bincount(sched.copy, weights=tokens)  # [C]
    rows_per_copy = np.bincount(sched.copy)  # [C]
    whole = (rows_per_copy > 0) & (rows_per_copy == steps.steps_per_request[np.arange(rows_per_copy.size) % r])
    seen = whole if whole.any() else rows_per_copy > 0
    tpot = per_copy_ms[seen] / per_copy_tok[seen]
    tok_r = np.bincount(source, weights=tokens, minlength=r)  # [R]
    ms_r = np.bincount(source, weights=share, minlength=r)  # [R]
    metrics = {**metrics, "decode_tok_s": metrics["throughput_tok_s"], "drafter_prefill_share": 0.0}
    if prefill is not None and arm.kind != "nospec":  # the drafter's prompt prefill (tune/prefill.py)
        extra = tok_r * prefill  # [R] ms of drafter prefill its tokens carry (tune/prefill.py)
        ms_r = ms_r + extra
        rate = 1e3 * tok_r.sum() / ms_r.sum()
        metrics |= {"throughput_tok_s": rate, "per_request_tok_s": rate / sched.concurrency,
                    "drafter_prefill_share": extra.sum() / ms_r.sum()}
    return Cell(arm, sched.concurrency, metrics, tok_r, ms_r, float(np.percentile(tpot, 90)))


def simulate_arms(steps: StepTable, arms: list[Arm], cost: CostTable, concurrency: list[int], *, waves: int,
                  estimator: str, gate: bool, prefill: np.ndarray | None = None,
                  progress: Callable[[], None] | None = None) -> list[Cell]:
    """Every arm at every concurrency. Adaptive arms run on the traces truncated to their K, each with its
    own estimator burn-in (as `avkit simulate` does). `prefill`: [R] drafter prefill ms per output token of
    each recorded request (tune/prefill.py), added to every arm that drafts; None: not priced."""
    cells = []
    scheds = {c: schedule(steps, c, waves) for c in concurrency}  # request lengths do not depend on K
    for arm in arms:
        view = truncate(steps, arm.k) if arm.kind.startswith("adaptive") else steps
        policy = SimPolicy(arm.spec(estimator, gate)).prepare(view)
        for c in concurrency:
            cells.append(_cell(arm, Replay.build(view, scheds[c], cost), policy, prefill))
            if progress is not None:
                progress()
    return cells


# Bootstrap over recorded requests: a resample draws R requests with replacement (weights w [B, R]),
# throughput (w @ tokens) / (w @ time). The same weights serve every cell, so a ratio is paired. The replay is
# not rerun per resample: the intervals measure which requests the traces hold, not the simulator's error.
def resampled_rate(weights: np.ndarray, tokens: np.ndarray, time_ms: np.ndarray) -> np.ndarray:
    """[B] tokens per second under each resample: weights [B, R], tokens [R], time_ms [R]."""
    return 1e3 * (weights @ tokens) / np.maximum(weights @ time_ms, 1e-300)


def interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """Equal-tailed percentile interval of bootstrap samples [B]."""
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(samples, [tail, 100.0 - tail])
    return float(lo), float(hi)
