"""Draft gate (docs/budget.md "The draft gate"): whether a step drafts at all, the one decision that can pick
target-only decoding (the budget and early stop act after drafting started).

  rows        the sizing confidences [W, K] of the last `window` drafted request-steps (adaptive.py `sizing`);
              survival s[r, j] = prod_{i<=j} c[r, i]
  step rate   the policy's step replayed on the rows at this step's load n, each row standing for n/W
              requests, verifying the top-m survival slots (m = 0..W K):
                rate(m) = (n + n/W sum_top-m s) / (draft_ms + context_ms(n) + verify_ms(n + m n/W))
              draft_ms = sum_j P(pass j runs) draft_ms(requests in it) when the drafter stops early (p_j the
              share of rows of depth >= j: P = 1 - (1 - p_j)^n, n p_j / P requests), else draft_ms(n, K)
  gain        max_{m>=1} rate(m) / rate(0); the step drafts iff gain > 1 (while off: > 1 + `resume_margin`).
              Until `window` rows were seen it uses the gain of sure drafts (every confidence 1)
  paid back   with the step's lags and remaining tokens, a step that would draft does so only if
                sum_r catch_up_ms(lag_r) <= sum_r remaining_r * saving,
                saving = (target-only step ms) / n * (1 - 1 / gain)   (ms per output token)
  probe       after `probe_every` skipped steps in a row the rows are forgotten and a new window measured
Lossless: the load and earlier steps' features decide, never this step's draws (docs/lossless.md). Live one
step at a time (`draft_this_step`), in the simulator over its steps in order (`replay`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from avkit.config import DEFAULT_K, AdaptiveConfig
from avkit.scheduling.cost import CostTable
from avkit.scheduling.plan import order_slots, survival


AHEAD = 64  # steps `replay` prices at once at most while the gate drafts


def _ms(fn, x: torch.Tensor) -> torch.Tensor:
    """A cost-table curve (numpy in, numpy out) at float64 CPU points x."""
    return torch.as_tensor(np.asarray(fn(x.numpy()), dtype=np.float64))


def step_rates(conf, num_requests, cost: CostTable, stop_drafting: bool = True) -> torch.Tensor:
    """Tokens per ms of the step replayed on rows conf [W, K] at n requests -> [W K + 1] (module note); or
    on G windows at once: conf [G, W, K], num_requests [G] -> [G, W K + 1], the same operations per window.
    The slots are ranked by plan.py's rule (every row drafted K)."""
    conf = torch.as_tensor(conf, dtype=torch.float64).cpu()
    one = conf.dim() == 2
    conf = conf[None] if one else conf  # [G, W, K]
    g, w, k = conf.shape
    m = w * k
    key = survival(conf.reshape(g * w, k), torch.full((g * w,), k)).reshape(g, m)  # [G, M] every slot valid
    order = order_slots(key)  # [G, M]
    top = key.gather(1, order).cumsum(1)  # [G, M] sum of the top m survivals
    n = torch.as_tensor(num_requests, dtype=torch.float64).reshape(g, 1)  # [G, 1]
    tokens = n + (n / w) * torch.cat([top.new_zeros(g, 1), top], 1)  # [G, M+1]
    verified = n + (n / w) * torch.arange(m + 1, dtype=torch.float64)  # [G, M+1] target tokens of the step
    target = _ms(lambda t: cost.step_cost(n.numpy(), 0, t), verified)  # [G, M+1] its KV reads and verify
    if stop_drafting and cost.drafter == "autoregressive":  # pass j runs iff a request reaches depth j + 1
        reach = torch.arange(w + 1, dtype=torch.float64) / w  # [W+1] share of the rows reaching the depth
        runs = 1.0 - (1.0 - reach) ** n  # [G, W+1] P(the pass runs)
        active = n * reach / runs.clamp(min=1e-300)  # [G, W+1] requests in it, when it runs
        pass_ms = runs * _ms(cost.draft_pass_cost, active) * (reach > 0)  # [G, W+1] expected ms
        first_ms = runs * _ms(cost.draft_fixed_cost, active) * (reach > 0)  # [G, W+1] paid with pass 1
        count = torch.zeros(g, m + 1, k, dtype=torch.int64)  # [G, M+1, K] rows of depth > j among the top m
        count[:, 1:] = torch.nn.functional.one_hot(order % k, k).cumsum(1)
        draft = first_ms.gather(1, count[:, :, 0])  # [G, M+1] expected ms of the passes that run, left to right
        for j in range(k):
            draft = draft + pass_ms.gather(1, count[:, :, j])
    else:  # every drafting request drafts K: a parallel drafter pays its one pass however deep it drafts
        draft = _ms(lambda x: cost.draft_cost(x, k), n) * (torch.arange(m + 1) > 0)  # [G, M+1]
    rates = tokens / (draft + target)
    return rates[0] if one else rates


@dataclass
class DraftGate:
    """Skip drafting while, at this step's load, no verify budget on recent rows pays for its drafts."""

    cost: CostTable
    # gate_window (recent drafted request-steps the decision replays, `window`), probe_every (skipped steps in a
    # row before a probing drafted step), resume_margin (while off, resume only for a predicted gain above it)
    config: AdaptiveConfig = AdaptiveConfig()
    stop_drafting: bool = True  # the drafter stops each request early (live: `continue_drafting`)
    k: int = DEFAULT_K  # drafts per request at most (the width of the rows)
    rows: torch.Tensor | None = None  # [<= window, K] float64 (CPU) sizing confidences of the latest drafted request-steps
    skipped: int = 0  # consecutive skipped steps
    skipped_total: int = 0
    steps: int = 0  # steps asked about

    def __post_init__(self):
        self._memo: tuple = (None, None, 0.0)  # (rows object, n, gain): unchanged rows and load, same gain
        self._sure: dict[int, float] = {}  # n -> gain of sure drafts

    def use_cost(self, cost: CostTable) -> None:
        """Price with `cost` from now on (a learned model): the kept gains go."""
        self.cost = cost
        self._memo, self._sure = (None, None, 0.0), {}

    @staticmethod
    def _gains(rates: torch.Tensor) -> torch.Tensor:
        """[.., M+1] step rates -> [..] best speculative rate over target-only decoding."""
        return rates[..., 1:].max(-1).values / rates[..., 0]

    def gain(self, num_requests: int) -> float:
        """Best speculative rate over target-only decoding at this load, on the recent rows."""
        if self._memo[0] is not self.rows or self._memo[1] != num_requests:
            rate = step_rates(self.rows, num_requests, self.cost, self.stop_drafting)
            self._memo = (self.rows, num_requests, float(self._gains(rate)))
        return self._memo[2]

    def sure_gain(self, num_requests: int) -> float:
        """The gain if every draft were accepted: an upper bound on `gain` for any rows."""
        if num_requests not in self._sure:
            rate = step_rates(torch.ones(1, self.k), num_requests, self.cost, self.stop_drafting)
            self._sure[num_requests] = float(self._gains(rate))
        return self._sure[num_requests]

    def pays_back(self, num_requests: int, gain: float, lag, remaining) -> bool:
        """The step's catch-up (lag [n] host ints, > FREE_LAG: prefilled) against what drafting at `gain`
        saves over the tokens its requests may still emit (remaining [n]); module note, "paid back"."""
        price = float(self.cost.catch_up_cost(lag).sum())  # ms
        if price == 0.0:
            return True
        t0 = float(self.cost.step_cost(num_requests, 0, num_requests))  # a target-only step
        saving = t0 / num_requests * (1.0 - 1.0 / gain)  # ms per output token
        return price <= float(np.sum(remaining)) * saving

    def draft_this_step(self, num_requests: int, lag=None, remaining=None, gain: float | None = None) -> bool:
        """Ask once per step, before drafting; counts skipped steps and schedules probes. `lag` and
        `remaining` ([n] host ints, both or neither) price the step's catch-up (module note); `gain`: this
        step's `gain` on the recent rows if already known (`replay`)."""
        self.steps += 1
        if self.skipped >= self.config.probe_every:  # probe: forget the stale rows, measure a new window
            self.rows = None
        need = 1.0 if self.skipped == 0 else 1.0 + self.config.resume_margin  # resuming pays a catch-up
        if num_requests < 1:
            draft = True
        else:
            measuring = self.rows is None or len(self.rows) < self.config.gate_window  # measure if it could say yes
            gain = self.sure_gain(num_requests) if measuring else gain if gain is not None else self.gain(num_requests)
            draft = gain > need and (lag is None or self.pays_back(num_requests, gain, lag, remaining))
        self.skipped = 0 if draft else self.skipped + 1
        self.skipped_total += not draft
        return draft

    def observe(self, sizing_conf) -> None:
        """Keep a drafted step's sizing confidences ([B, K], the rows that drafted) among the recent rows: on a GPU
        the policy's one device-to-host copy per step, of a step whose decisions are already taken."""
        conf = torch.as_tensor(sizing_conf).to("cpu", torch.float64)
        if conf.shape[0] == 0:
            return
        if self.rows is not None and self.rows.shape[1] == conf.shape[1]:
            conf = torch.cat([self.rows, conf])
        self.rows = conf[-self.config.gate_window:].clone()

    def replay(self, num_requests: np.ndarray, conf: torch.Tensor, bounds: np.ndarray,
               drafts: np.ndarray) -> np.ndarray:
        """The simulator's steps in order: requests [G], sizing confidences [rows, K] of their rows (bounds [G+1]),
        which rows would draft [rows] -> drafted [G] bool. While the gate drafts, the windows of the next steps
        (as if they all draft) are priced in one `step_rates` call, kept until a step is skipped."""
        on = np.zeros(len(num_requests), dtype=bool)
        conf, drafts = torch.as_tensor(conf, dtype=torch.float64), torch.as_tensor(drafts, dtype=torch.bool)
        steps = [conf[a:b][drafts[a:b]] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]  # [G] rows
        loads = num_requests.tolist()
        ahead: dict[int, float | None] = {}
        span = 8  # steps priced ahead: doubled while every one drafts, back to 8 after a skip
        for g, n in enumerate(loads):
            if self.skipped:  # a skipped step invalidates what was priced as if every step drafted
                ahead, span = {}, 8
            elif g not in ahead:
                ahead, span = self._ahead(steps, loads, g, span), min(2 * span, AHEAD)
            on[g] = self.draft_this_step(n, gain=ahead.get(g))
            if on[g]:
                self.observe(steps[g])
        return on

    def _ahead(self, steps: list[torch.Tensor], loads: list[int], start: int, span: int) -> dict[int, float | None]:
        """step -> its gain if every step from `start` drafts, for the next `span` steps (None: window not full)."""
        stop = min(len(loads), start + span)
        k = steps[start].shape[1]
        base = self.rows if self.rows is not None and self.rows.shape[1] == k else torch.zeros(0, k, dtype=torch.float64)
        seq = torch.cat([base, *steps[start:stop]])  # [R, K] the rows observed, in order (as `observe` keeps them)
        ends = len(base) + np.cumsum([0] + [len(s) for s in steps[start:stop - 1]])  # rows seen before each step
        w = self.config.gate_window
        full = np.flatnonzero(ends >= w)
        out = dict.fromkeys(range(start, stop))
        if not full.size:
            return out
        idx = torch.as_tensor(ends[full])[:, None] - w + torch.arange(w)  # [F, W]
        ns = [loads[start + i] for i in full.tolist()]
        rates = step_rates(seq[idx], ns, self.cost, self.stop_drafting)
        out.update(zip((start + full).tolist(), self._gains(rates).tolist()))
        return out
