"""The engine: continuous batching around one speculative decoding step.

One `step()` (docs/lossless.md, docs/runtime.md):
  1. admit waiting requests into free KV slots and prefill the target with prompt[:-1]
  2. draft: the drafter proposes up to K tokens per request (K forwards batched over requests), unless
     the policy's optional `draft_this_step(load)` gate, judging from earlier steps, skips speculation,
     and its `draft_limits` caps each request's drafts (a schedule's K(b), its catch-up rule)
  3. decide: the verify policy picks k_r <= num_drafted_r from lossless features and the load
  4. verify: ONE target forward over [last token, x_1..x_{k_r}] for every request -> p_1..p_{k_r+1}
  5. rejection sampling: each request emits n_r accepted drafts + 1 recovered/bonus token
  6. roll back both KV caches to the accepted prefix; finish at EOS / stop ids / max tokens
  7. emit one trace row per draft slot through the sink; feed the outcome back to the policy
Invariant between steps: the target cache holds every token of a sequence but the last (the last
is fed, with the drafts, by the next verify forward). No draft model / k = 0: target-only decoding
through the same path (the "bonus" token of an empty draft is a plain sample from p).
Not thread-safe: call add_request / abort / step from one thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
import time
from collections import OrderedDict
from dataclasses import replace

import torch

from avkit.config import EngineConfig, ModelsConfig
from avkit.drafters.base import Drafter
from avkit.drafters.draft_model import DraftModelDrafter
from avkit.errors import ConfigError
from avkit.kernels.dispatch import select_kernels
from avkit.models.transformer import HostLengths
from avkit.runtime.prefill import prefill
from avkit.runtime.batch import append_tokens, draft_input, limit_drafts, no_drafts, roll_back, top_k_min_p
from avkit.runtime.request import FINISH_ABORT, EngineStats, Generation, Request, RunningSeq, StepOutput
from avkit.runtime.sampling import probs_from_logits
from avkit.runtime.trace_rows import TraceSink, trace_rows
from avkit.scheduling.cost import FREE_LAG
from avkit.scheduling.policy import FullVerification, VerifyPolicy
from avkit.step_types import DraftBatch, Load, StepPlan, StepTime, VerifyOutcome


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MMAP_THRESHOLD_MAX = 4 * 1024 * 1024 * ctypes.sizeof(ctypes.c_long)  # glibc's cap: 32 MB on 64-bit
TRIM_NEVER = 2**31 - 1  # bytes of free heap top kept before trimming (an int)


@functools.cache
def keep_freed_memory() -> bool:
    """A CPU engine keeps freed host memory mapped, so each step's vocabulary-wide buffers reuse their pages
    instead of faulting in fresh ones: glibc's mmap threshold at its maximum and no heap trimming, once per process
    (Linux/glibc only; AVKIT_KEEP_FREED_MEMORY=0 turns it off; docs/runtime.md). True when it took effect."""
    if os.environ.get("AVKIT_KEEP_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and \
            bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_NEVER))
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): its own policy stays
        return False

class Engine:
    """Speculative decoding with continuous batching over `config.concurrency` KV-cache slots.

    Parameters
    ----------
    target, draft : LoadedModel (``avkit.models.load``); draft None or ``config.k == 0`` -> target-only
    config : EngineConfig (K, batch, context length, default seed)
    policy : VerifyPolicy deciding k_r per request (default: verify every draft)
    sink : TraceSink receiving one batch of trace rows per step (default: none)
    drafter : a Drafter to use instead of the draft model (cache drafter, hybrid router)

    Example: ``Engine(target, draft, EngineConfig(k=5)).generate([Request("r0", [1, 2, 3])])``
    """

    def __init__(self, target, draft=None, config: EngineConfig | None = None,
                 policy: VerifyPolicy | None = None, sink: TraceSink | None = None,
                 drafter: Drafter | None = None):
        config = config if config is not None else EngineConfig()
        self.target, self.config, self.sink = target, config, sink
        self.policy = policy if policy is not None else FullVerification()
        self.vocab_size = target.model.config.vocab_size
        if drafter is None and draft is not None and config.k > 0:
            dv = draft.model.config.vocab_size
            if dv != self.vocab_size:
                raise ConfigError(f"draft vocabulary ({dv} tokens, {draft.model_id}) does not match the "
                                  f"target's ({self.vocab_size} tokens, {target.model_id})")
        self.cache = target.model.new_cache(config.concurrency, config.max_len)
        self.device = self.cache.lengths.device  # every per-step tensor lives beside the model
        # The hot-path kernels, chosen once: confidence in the draft passes, the plan's allocation and
        # the refit's statistics in the policy, rejection sampling here.
        self.kernels = select_kernels(self.device, config.kernels)
        if self.device.type == "cpu":  # per-step vocabulary-wide buffers reuse their pages
            keep_freed_memory()
        self.policy.use_kernels(self.kernels)
        if drafter is None and draft is not None and config.k > 0:
            drafter = DraftModelDrafter(draft, config.concurrency, config.max_len, self.kernels)
        self.drafter = drafter if config.k > 0 else None
        self.eos = frozenset(getattr(target.tokenizer, "eos_token_ids", ()) or ())
        self.waiting: OrderedDict[str, Request] = OrderedDict()
        self.running: dict[str, RunningSeq] = {}
        self.free_slots = list(range(config.concurrency))
        self.engine_step = 0
        self.stats = EngineStats()

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        if req.request_id in self.waiting or req.request_id in self.running:
            raise ConfigError(f"request_id {req.request_id!r} is already in the engine")
        if len(req.prompt_ids) >= self.config.max_len:
            raise ConfigError(f"request {req.request_id!r}: prompt has {len(req.prompt_ids)} tokens, "
                              f"max_len={self.config.max_len} leaves no room to generate")
        bad = [t for t in req.prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ConfigError(f"request {req.request_id!r}: token id {bad[0]} outside the vocabulary "
                              f"[0, {self.vocab_size})")
        self.waiting[req.request_id] = req

    def abort(self, request_id: str) -> bool:
        """Drop a waiting or running request; True if it was there."""
        if self.waiting.pop(request_id, None) is not None:
            return True
        seq = self.running.get(request_id)
        if seq is not None:
            self._finish(seq)
        return seq is not None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _admit(self) -> None:
        new: list[RunningSeq] = []
        while self.waiting and self.free_slots:
            _, req = self.waiting.popitem(last=False)
            seed = req.sampling.seed if req.sampling.seed is not None else self.config.seed
            seq = RunningSeq(req, self.free_slots.pop(0), list(req.prompt_ids), seed, req.key)
            self.running[req.request_id] = seq
            new.append(seq)
        self.running = dict(sorted(self.running.items(), key=lambda kv: kv[1].slot))  # contiguous slots
        # The target cache holds all but the last prompt token (the first verify forward feeds it).
        prefill(self._target_forward, [s.tokens[:-1] for s in new], [s.slot for s in new], device=self.device,
                ragged=getattr(self.target.model, "ragged_prefill", False))

    def _finish(self, seq: RunningSeq) -> None:
        del self.running[seq.req.request_id]
        self.cache.free(seq.slot)
        if self.drafter is not None:
            self.drafter.observe_final(seq.slot, seq.tokens)  # a cache drafter keeps the whole response
            self.drafter.release(seq.slot)
        self.free_slots.append(seq.slot)
        self.free_slots.sort()

    def _target_forward(self, tokens, q_lens, slots, logits, host: HostLengths | None = None, prefill: bool = False):
        t0 = time.perf_counter()
        out = self.target.model.forward(tokens, q_lens, slots, self.cache, logits=logits, host=host, prefill=prefill)
        self.stats.target_forward_s += time.perf_counter() - t0
        return out

    # ---- the step ----------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        t0 = time.perf_counter()
        self._admit()
        batch = list(self.running.values())
        if not batch:
            return []
        t_decode = time.perf_counter()  # the step's shape starts here: admission prefill is not part of it
        draft, inp, load = self._draft(batch)
        t_drafted = time.perf_counter()  # host-synchronous on CPU: the drafting phase ends here
        K = draft.tokens.shape[1]

        # Decide k_r in [0, num_drafted_r] from what cannot depend on the drawn tokens: lossless features
        # and the load (the policy's plan: survival -> rank -> b* = argmax E(b)/cost(b) -> prefixes).
        # A planning drafter (HVD's joint router) proposed exactly the prefixes its plan verifies.
        plan = StepPlan(draft.num_drafted)  # [B]; nothing drafted: nothing to decide
        if K > 0 and not self.drafter.plans:
            plan = self.policy.num_verify(DraftBatch(draft.features, draft.num_drafted, draft.confidences,
                                                     draft.cache_rows), load)
        num_verify = plan.num_verify.to(self.device, torch.int64).clamp_min(0).minimum(draft.num_drafted)  # [B]
        # Host read 1 (docs/runtime.md): k_r sizes the verify forward ([B, 1 + max k_r]).
        verify_lens = num_verify.tolist()

        # One target forward: row r feeds [last token, x_1..x_{k_r}] and gets p_1..p_{k_r+1}; the target
        # cache holds all but the last token, so row r's cached length is len - 1 (host bookkeeping).
        k = max(verify_lens, default=0)
        last = torch.tensor([s.tokens[-1] for s in batch], dtype=torch.int64).to(self.device)[:, None]
        tokens = torch.cat([last, draft.tokens[:, :k]], dim=1)  # [B, 1+k]
        host = HostLengths(inp.slot_ids, tuple(len(s.tokens) - 1 for s in batch), tuple(1 + v for v in verify_lens))
        logits = self._target_forward(tokens, 1 + num_verify, inp.slots, "all", host)  # [B, 1+k, V]
        # An all-greedy batch verifies against argmax p_j, which the logits give directly (no [B, 1+k, V]
        # one-hot); its drafters handed over no q either (DraftInput.q_width).
        target_probs = logits if inp.greedy else probs_from_logits(
            logits, inp.temperature[:, None], inp.top_p[:, None], *top_k_min_p(batch, self.device),
            nucleus=inp.nucleus, greedy=inp.greedy)

        # Accept x_j with probability min(1, p_j(x_j) / q_j(x_j)); at the first rejection resample from
        # norm(max(0, p_j - q_j)), else add a bonus token from p_{k_r+1}: the output follows p for any k_r
        # chosen without looking at the draws. T = 0 rows have one-hot p and q (accept iff x_j = argmax
        # p_j); an all-greedy batch takes the greedy path, which draws no random numbers.
        result = self.kernels.rejection_sample(target_probs, draft.probs[:, :k], draft.tokens[:, :k],
                                               num_verify, greedy=bool(inp.greedy), seeds=inp.seeds,
                                               request_keys=inp.request_keys, positions=inp.positions)
        # Host read 2: the emitted tokens and accepted counts, one packed copy the host appends.
        packed = torch.cat([result.num_accepted[:, None], result.output_tokens], dim=1).tolist()  # [B, 1 + k+1]
        outputs = append_tokens(batch, [row[1:] for row in packed], [row[0] for row in packed], self.eos,
                                self.config.max_len)
        roll_back(batch, inp.slots, self.cache, self.drafter)
        for seq, out in zip(batch, outputs):
            if out.finished:
                self._finish(seq)

        if K > 0:  # labels for the online refit (statistics summed on the device): the sampler's own
            wide = lambda x: torch.nn.functional.pad(x, (0, K - k))  # [B, k] -> [B, K], False beyond k
            self.policy.observe(VerifyOutcome(draft.features, plan.confidences, num_verify, result.num_accepted,
                                              draft.cache_rows, wide(result.observed), wide(result.accepted)))
        self._account(batch, inp, draft, num_verify, result, plan, outputs, t0)
        self._time_step(batch, load, inp, verify_lens, t_decode, t_drafted)
        return outputs

    def _time_step(self, batch, load: Load, inp, verify_lens: list[int], t_decode: float, t_drafted: float) -> None:
        """The step's shape and time for the policy's cost model (host counts only, no device read). On CPU the
        drafting phase is timed apart (it tells the learner a draft pass from a verify token, which batch-1 steps
        alone cannot: their passes and verified tokens rise together); on an accelerator the phase's end would
        need a device sync, so only the step is timed."""
        drafting = self.drafter is not None and inp.k > 0
        passes = self.drafter.passes if drafting else 0
        wanted = inp.host_num_draft() if passes else ()
        catch_up = tuple(lag for lag, w in zip(load.lag or (), wanted) if lag > FREE_LAG and w > 0)
        timing = StepTime(len(batch), passes, len(batch) + sum(verify_lens), sum(len(s.tokens) - 1 for s in batch),
                          (time.perf_counter() - t_decode) * 1e3, self.drafter.draft_rows if passes else 0,
                          self.drafter.lookups if drafting else 0, catch_up,
                          (t_drafted - t_decode) * 1e3 if passes and self.device.type == "cpu" else None)
        self.stats.cost_ratio = self.policy.observe_step_time(timing)

    def _draft(self, batch: list[RunningSeq]):
        """Drafts for the batch (or none), their DraftInput and the step's load."""
        inp = draft_input(batch, self.config.k, self.config.max_len, self.drafter is not None, self.device)
        drafting = self.drafter is not None and inp.k > 0
        load = Load(num_requests=len(batch), num_sampling=len(batch), num_scheduled_tokens=len(batch),
                    lag=tuple(self.drafter.lag(s.slot, len(s.tokens)) for s in batch) if drafting else None,
                    remaining=tuple(s.req.sampling.max_new_tokens - s.num_output for s in batch) if drafting else None)
        # The gate (from earlier steps only) may skip speculation; it weighs draft-model passes against the
        # cost table, so cache and hybrid drafters are never gated. The policy may stop drafting early.
        if drafting and self.drafter.kind == "model" and not self.policy.draft_this_step(load):
            inp = limit_drafts(inp, [0] * len(batch), self.device)
        if self.drafter is not None and inp.max_draft > 0:  # per request (a schedule's K(b), its catch-up rule)
            limits = self.policy.draft_limits(load, list(load.lag), list(load.remaining))
            if limits is not None:
                inp = limit_drafts(inp, limits, self.device)
        inp = replace(inp, continue_drafting=lambda so_far: self.policy.continue_drafting(so_far, load),
                      coefficients=self.policy.confidence_coefficients(self.device))
        if self.drafter is None or inp.k == 0:
            return no_drafts(len(batch), self.vocab_size, self.device), inp, load
        return self.drafter.propose(inp), inp, load

    def _account(self, batch, inp, draft, num_verify, result, plan, outputs, t0: float) -> None:
        """Trace rows (when recording) and the cumulative stats."""
        if self.sink is not None and draft.tokens.shape[1] > 0:
            self.sink.emit(trace_rows(batch, inp, draft, num_verify, result, plan.confidences,
                                      engine_step=self.engine_step,
                                      step_time_ms=(time.perf_counter() - t0) * 1e3))
        self.engine_step += 1
        self.stats.steps += 1
        self.stats.tokens += sum(len(o.new_token_ids) for o in outputs)
        self.stats.step_s += time.perf_counter() - t0
        if self.drafter is not None:
            self.stats.draft_forward_s = self.drafter.forward_s

    # ---- convenience -------------------------------------------------------------------------
    def generate(self, requests: list[Request]) -> list[Generation]:
        """Run requests to completion (continuous batching); Generations in request order."""
        for r in requests:
            self.add_request(r)
        outs: dict[str, list[StepOutput]] = {r.request_id: [] for r in requests}  # each request's step outputs
        while self.has_unfinished():
            for o in self.step():
                outs.get(o.request_id, []).append(o)
        return [Generation(r.request_id, list(r.prompt_ids), [t for o in outs[r.request_id] for t in o.new_token_ids],
                           next((o.finish_reason for o in outs[r.request_id] if o.finished), FINISH_ABORT), r.dataset,
                           len(outs[r.request_id])) for r in requests]


def make_engine(target, draft, config: EngineConfig, models: ModelsConfig, *, policy: VerifyPolicy | None = None,
                sink: TraceSink | None = None, cache=None) -> Engine:
    """The engine of `models.drafter` (record's and serve's): the model drafter, which the engine builds, or
    with a draft model the hybrid one (`cache`: a server's SuffixCache, kept when a failed engine is replaced)."""
    drafter = None
    if models.drafter == "hybrid" and draft is not None:
        from avkit.hvd.hybrid_drafter import HybridDrafter  # lazy: the HVD stack (--drafter hybrid only)

        # the draft model behind the router of --payoff (HybridDrafter.from_file)
        drafter = HybridDrafter.from_file(DraftModelDrafter(draft, config.concurrency, config.max_len),
                                          models.payoff or None, models.target, k=config.k, cache=cache)
    return Engine(target, draft, config, policy=policy, sink=sink, drafter=drafter)
