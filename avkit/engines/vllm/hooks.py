"""Runs INSIDE vLLM's process: wraps six vLLM V1 methods at run time (each calls the original unchanged) to
observe every draft slot, and turns what they saw into trace columns (where each column comes from:
docs/vllm.md, "The hook"). Slots are matched across the two steps (drafted at s, verified at s+1) by request
id. The cache drafters `ngram` and `suffix` compute no draft logits: their slots get the features of a point
mass (CACHE_FEATURES). Imports torch, numpy and light avkit modules only (vLLM's venv has no polars).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from avkit.features import draft_features
from avkit.runtime.trace_rows import slot_rows
from avkit.trace import labels

FEATURES = ("q_max", "q_2nd", "entropy", "logit_qmax")
PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID in rejection_sample's output
CACHE_FEATURES = (1.0, 0.0, 0.0, 40.0, 1.0)  # FEATURES then q_sampled of a deterministic draft (logit_qmax clamped)


def _features(logits: torch.Tensor, temperature) -> torch.Tensor:
    """[B, V] draft logits -> [B, F] (FEATURES order), at temperature [B] or 1 (T = 0 read as 1)."""
    t = 1.0 if temperature is None else temperature[: logits.shape[0]].float()
    f = draft_features(logits, t)
    return torch.stack([f[n] for n in FEATURES], dim=-1)


class Recorder:
    """What the wrappers collect; `active` gates them (vLLM's warm-up and dummy runs are not recorded)."""

    def __init__(self):
        self.active = False
        self._passes: list[torch.Tensor] = []  # per drafting pass: [B, F + 1] features and q(x) of this proposal
        self.pending: dict[str, tuple[list[int], torch.Tensor, str]] = {}  # req id -> (tokens [K], [K, F + 1], drafter)
        self._last_verify: dict | None = None  # the rejection_sample call of this step
        self.rows: list[dict] = []  # per request-step: the slots verified in this engine step
        self.verify_steps: dict[str, int] = {}  # req id -> verify steps so far (the trace's `step`)
        self.draft_s = 0.0  # this engine step: wall time inside propose_draft_token_ids (all K drafting passes)
        self.scheduled_tokens = 0  # this engine step: target tokens vLLM's scheduler gave the model runner
        self.scheduled_requests = 0  # this engine step: requests scheduled (the batch size Dynamic SD's lookup reads)
        self.on_step = None  # plugin.py: called with (model runner, scheduler output) as each engine step starts
        self.on_step_end = None  # plugin.py: called with the model runner once a step's drafting is done

    # ---- drafting ----
    def draft_pass(self, feats: torch.Tensor, q_sampled: torch.Tensor) -> None:
        """One drafting pass: features [B, F] and q(x) of the drawn tokens [B]."""
        self._passes.append(torch.cat([feats, q_sampled[:, None]], dim=-1).cpu())  # [B, F + 1]

    def begin_proposal(self) -> None:
        self._passes = []

    def end_proposal(self, req_ids: list[str], draft_token_ids, method: str = "draft_model") -> None:
        """`method`: vLLM's speculative method; a list of token lists with no drafting pass is a cache draft."""
        if self.active and not self._passes and isinstance(draft_token_ids, list) and method in ("ngram", "suffix"):
            for rid, toks in zip(req_ids, draft_token_ids):
                if len(toks):
                    self.pending[rid] = (list(map(int, toks)), torch.tensor([CACHE_FEATURES] * len(toks)), method)
            return
        if not self.active or not self._passes or not isinstance(draft_token_ids, torch.Tensor):
            self._passes = []
            return
        tokens = draft_token_ids.detach().cpu().to(torch.int64)  # [B, K]
        feats = torch.stack(self._passes, dim=1)  # [B, K, F + 1]
        self._passes = []
        for i, rid in enumerate(req_ids[: tokens.shape[0]]):
            self.pending[rid] = (tokens[i].tolist(), feats[i], "model")

    # ---- verification ----
    def verify(self, draft_token_ids, num_draft_tokens, target_logits, sampling_metadata) -> None:
        if not self.active:
            return
        x = draft_token_ids.to(torch.int64)  # [N]
        logits = target_logits.float()  # [N, V]
        p = torch.exp(logits.gather(1, x[:, None])[:, 0] - torch.logsumexp(logits, dim=-1))  # [N]
        hit = (logits.argmax(dim=-1) == x).float()  # [N]
        if sampling_metadata.all_greedy:
            greedy_tok = torch.ones_like(p, dtype=torch.bool)
        elif sampling_metadata.all_random:
            greedy_tok = torch.zeros_like(p, dtype=torch.bool)
        else:
            per_req = (sampling_metadata.temperature == 0).cpu()
            greedy_tok = per_req.repeat_interleave(torch.tensor(list(num_draft_tokens)))
        self._last_verify = torch.where(greedy_tok, hit, p).cpu()  # [N] p(x) as vLLM verifies it

    def verified(self, req_ids: list[str], num_draft_tokens, output_token_ids: torch.Tensor, vocab_size: int,
                 batch_size: int) -> None:
        """After rejection sampling: one record per request that verified drafts this step."""
        if not self.active or self._last_verify is None:
            return
        out = output_token_ids.cpu()  # [B, max_spec + 1]
        valid = ((out != PLACEHOLDER) & (out < vocab_size)).sum(dim=1)  # [B] accepted + 1
        p = self._last_verify
        self._last_verify = None
        start = 0
        for i, (rid, n) in enumerate(zip(req_ids, num_draft_tokens)):
            if n == 0:
                continue
            if rid not in self.pending:  # drafted by a path the hooks do not see: not traced
                start += n
                continue
            tokens, feats, drafter = self.pending.pop(rid)
            step = self.verify_steps.get(rid, 0)
            self.verify_steps[rid] = step + 1
            self.rows.append({
                "request_id": rid, "drafter": drafter, "step": step, "num_drafted": len(tokens), "num_verified": int(n),
                "num_accepted": int(valid[i]) - 1, "batch_size": batch_size, "draft_token": tokens,
                "features": feats.tolist(),  # [K][F + 1]: FEATURES, then q_sampled
                "target_prob": p[start:start + n].tolist(),
            })
            start += n

    def take_rows(self) -> list[dict]:
        rows, self.rows = self.rows, []
        return rows

    def take_timing(self) -> tuple[float, int, int]:
        """(ms spent drafting, target tokens scheduled, requests scheduled) in the engine step just run; resets."""
        out = (self.draft_s * 1e3, self.scheduled_tokens, self.scheduled_requests)
        self.draft_s, self.scheduled_tokens, self.scheduled_requests = 0.0, 0, 0
        return out

    def forget(self, req_id: str) -> None:
        self.pending.pop(req_id, None)
        self.verify_steps.pop(req_id, None)


RECORDER = Recorder()


def slot_columns(records: list[dict], requests: dict[str, tuple[str, str, float, float]], step_time_ms: float,
                 engine_step: int) -> dict[str, np.ndarray]:
    """One engine step's records (`Recorder.rows`) -> trace columns (`slot_rows`) in (record, position) order;
    `requests`: vLLM's request id -> (the tables' request id, dataset, temperature, top-p). A record holds its K
    drafted slots (K: the draft's own length for a cache drafter), `features` [K][F + 1] (FEATURES, then
    q_sampled) and `target_prob` [num_verified]; labels by trace/labels.py."""
    k = np.array([r["num_drafted"] for r in records], dtype=np.int64)  # [R]
    r_idx = np.repeat(np.arange(len(records)), k)  # [N]
    j = np.arange(len(r_idx)) - np.repeat(np.cumsum(k) - k, k)  # [N] position within the record
    feats = np.concatenate([np.asarray(r["features"], dtype=np.float32).reshape(-1, len(FEATURES) + 1)
                            for r in records])  # [N, F + 1]
    per = {key: [r[key] for r in records] for key in ("step", "num_drafted", "num_verified", "num_accepted",
                                                      "batch_size")}
    n_ver, n_acc = np.asarray(per["num_verified"])[r_idx], np.asarray(per["num_accepted"])[r_idx]  # [N]
    p = np.full(len(r_idx), np.nan, dtype=np.float32)  # [N]
    p[j < n_ver] = np.concatenate([np.asarray(r["target_prob"], dtype=np.float32) for r in records])
    reqs = [requests[r["request_id"]] for r in records]
    return slot_rows(r_idx, j, {**per, "drafter": [r.get("drafter", "model") for r in records],
                                **{name: [q[i] for q in reqs] for i, name in
                                   enumerate(("request_id", "dataset", "temperature", "top_p"))}},
                     np.concatenate([np.asarray(r["draft_token"]) for r in records]),
                     {name: feats[:, i] for i, name in enumerate(FEATURES)}, feats[:, len(FEATURES)], p, j < n_acc,
                     labels.observed(j, n_ver, n_acc), step_time_ms=step_time_ms, engine_step=engine_step)


def _patch(owner, name: str, wrapper) -> None:
    """owner.name = a function calling `wrapper(original, *args)` (a method's args start with self)."""
    original = getattr(owner, name)
    setattr(owner, name, lambda *args, **kwargs: wrapper(original, *args, **kwargs))


def install() -> Recorder:
    """Wrap vLLM's methods (idempotent; those of the SUPPORTED vLLM versions, which plugin.register and
    driver.check_vllm_version check); -> the process-wide recorder."""
    from vllm.v1.sample import rejection_sampler as rs  # optional: vllm
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer  # optional: vllm
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # optional: vllm

    if getattr(GPUModelRunner, "_avkit_hooked", False):
        return RECORDER
    rec = RECORDER

    def _greedy_sample(orig, self, hidden_states):
        if not rec.active or self.use_local_argmax_reduction or self.use_heterogeneous_vocab:
            return orig(self, hidden_states)  # (the last two never materialise the draft logits: not traced)
        logits = self.model.compute_logits(hidden_states)  # [B, V]: the same call vLLM makes
        rec.draft_pass(_features(logits, None), torch.ones(logits.shape[0]))  # verified against a one-hot q
        return logits.argmax(dim=-1)

    def _sample_from_logits(orig, self, logits, sampling_metadata):
        if not rec.active:
            return orig(self, logits, sampling_metadata)
        t = None if sampling_metadata.all_greedy else sampling_metadata.temperature
        feats = _features(logits, t)  # before vLLM divides the logits in place
        tokens, probs = orig(self, logits, sampling_metadata)
        q = torch.ones(tokens.shape[0])  # greedy drafting: vLLM verifies against a one-hot q
        if probs is not None and not sampling_metadata.all_greedy:
            q = probs.float().gather(1, tokens.to(torch.int64)[:, None])[:, 0].cpu()
            if t is not None:
                q = torch.where(t[: q.shape[0]].cpu() == 0, torch.ones_like(q), q)
        rec.draft_pass(feats, q)
        return tokens, probs

    def propose_draft_token_ids(orig, self, *args, **kwargs):
        rec.begin_proposal()
        t0 = time.perf_counter()
        out = orig(self, *args, **kwargs)
        rec.draft_s += time.perf_counter() - t0
        rec.end_proposal(list(self.input_batch.req_ids), out, self.speculative_config.method)
        if rec.on_step_end is not None:
            rec.on_step_end(self)
        return out

    def execute_model(orig, self, scheduler_output, *args, **kwargs):
        if rec.on_step is not None:
            rec.on_step(self, scheduler_output)
        rec.scheduled_tokens += int(scheduler_output.total_num_scheduled_tokens)
        rec.scheduled_requests += len(scheduler_output.num_scheduled_tokens)
        return orig(self, scheduler_output, *args, **kwargs)

    def rejection_sample(orig, draft_token_ids, num_draft_tokens, *args, **kwargs):
        # args: max_spec_len, cu_num_draft_tokens, draft_probs, target_logits, bonus_token_ids, sampling_metadata
        rec.verify(draft_token_ids, num_draft_tokens, args[3], args[5])
        return orig(draft_token_ids, num_draft_tokens, *args, **kwargs)

    def _sample(orig, self, logits, spec_decode_metadata):
        out = orig(self, logits, spec_decode_metadata)
        if spec_decode_metadata is not None:
            n = self.input_batch.num_reqs
            rec.verified(list(self.input_batch.req_ids[:n]), spec_decode_metadata.num_draft_tokens,
                         out.sampled_token_ids, self.input_batch.vocab_size, n)
        return out

    for owner, wrapper in ((SpecDecodeBaseProposer, _greedy_sample), (SpecDecodeBaseProposer, _sample_from_logits),
                           (GPUModelRunner, propose_draft_token_ids), (GPUModelRunner, execute_model),
                           (GPUModelRunner, _sample), (rs, rejection_sample)):
        _patch(owner, wrapper.__name__, wrapper)
    GPUModelRunner._avkit_hooked = True
    return rec
