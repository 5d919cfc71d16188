"""The values one speculative step passes between its stages (a leaf module: torch and dataclasses only).

  drafter ──DraftBatch──► policy ──StepPlan──► verifier ──VerifyOutcome──► policy (online refit)
                     Load ──┘
The drafter, the verify policy, the engine and the simulator all speak these types, so none of
them imports another stage to learn its shapes. Every tensor lives on the engine's device.
The engine's step is one `Load`; the simulator hands a policy many steps at once as `Groups` (row r of
the DraftBatch belongs to step group[r]), and the policy decides them all with the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Load:
    """What the scheduler knows about this step besides the drafts (host ints, from its own bookkeeping)."""

    num_requests: int  # requests in the step
    num_sampling: int  # N_s: requests that sample a token this step (not mid-prefill)
    num_scheduled_tokens: int  # T: non-draft target tokens already scheduled (1 per decoding request + prefill)
    # [B] per request, from the engine's bookkeeping when a draft model may draft (None: not given):
    lag: tuple[int, ...] | None = None  # tokens of the sequence its drafter has not seen (a catch-up's size)
    remaining: tuple[int, ...] | None = None  # new tokens it may still emit (max_new_tokens - emitted)


@dataclass(frozen=True)
class Groups:
    """Many steps' loads at once (the simulator's group vector; the engine's step is one `Load`).
    Every step decodes: no request is mid-prefill, no lags (the replayed traces start caught up)."""

    group: torch.Tensor  # [B] int64, ascending: the step of each row
    num_requests: torch.Tensor  # [G] int64, requests in each step (N_s = T = this)

    @property
    def num_groups(self) -> int:
        return self.num_requests.numel()


@dataclass(frozen=True)
class DraftBatch:
    """Lossless features of this step's drafts. Never holds q(x_sampled) or the drawn tokens."""

    features: dict[str, torch.Tensor]  # name -> [B, K] float32, lossless features only
    num_drafted: torch.Tensor  # [B] int64, drafts proposed per request (<= K)
    # [B, K] float32 acceptance predictions already made inside the draft passes (the confidence
    # kernel, from the estimator's coefficients); None: the policy predicts from `features`
    confidences: torch.Tensor | None = None
    # [B] bool, rows the suffix cache drafted (HVD's hybrid drafter; the trace's `drafter` = "suffix"):
    # the policy scores them with the cache's own estimator; None: every row is the draft model's
    cache_rows: torch.Tensor | None = None


@dataclass(frozen=True)
class StepPlan:
    """A verify policy's decision for one step."""

    num_verify: torch.Tensor  # [B] int64, k_r in [0, num_drafted_r]: the verified prefix length of request r
    confidences: torch.Tensor | None = None  # [B, K] predictions the decision used (None: none; the trace's column)


@dataclass(frozen=True)
class VerifyOutcome:
    """What verification decided, fed back to the policy for online refits."""

    features: dict[str, torch.Tensor]  # name -> [B, K] (same as DraftBatch)
    confidences: torch.Tensor | None  # [B, K] predictions used when deciding (None if none)
    num_verify: torch.Tensor  # [B] int64
    num_accepted: torch.Tensor  # [B] int64
    cache_rows: torch.Tensor | None = None  # [B] bool (as DraftBatch): whose estimator each row's labels teach
    observed: torch.Tensor | None = None  # [B, K] bool: the slot carries a label (RejectionResult.observed;
    # None: trace/labels.py's rule from num_verify and num_accepted, for a policy driven without a sampler)
    accepted: torch.Tensor | None = None  # [B, K] bool: its label (RejectionResult.accepted), with `observed`


@dataclass(frozen=True)
class StepTime:
    """One engine step's shape and wall time, for a policy that learns its cost model (host values)."""

    num_requests: int  # requests in the step
    passes: int  # draft passes that ran (0: target-only)
    tokens: int  # target tokens the verify forward computed (one per request + the verified drafts)
    context_tokens: int  # cached tokens of the step's requests in all (the KV the target read)
    ms: float  # wall time from after admission (the target's prompt prefill is not the step's shape)
    draft_rows: int | None = None  # requests the draft passes ran over (None: all; a hybrid drafter: its model rows)
    lookups: int = 0  # requests a cache drafter looked up (suffix cache, hybrid router)
    catch_up: tuple[int, ...] = ()  # lags (tokens) of the requests whose drafter first prefilled them (> FREE_LAG)
    drafting_ms: float | None = None  # wall time of the drafting phase within `ms` (None: not timed apart)


__all__ = ["DraftBatch", "Groups", "Load", "StepPlan", "StepTime", "VerifyOutcome"]
