"""`avkit profile`: this device's step costs (docs/budget.md "Cost tables"), timing the engine's own step
(`Engine.step`) at a real KV prefix and the config's sampling, per point:
  verify(T)     T tokens laid out ceil(T / (K+1)) requests, drafted for free and all verified
  request(n)    the target-only step of n requests less verify(T = n): `request_ms`; verify then holds one
                request (`per_request`)
  draft(n)      n requests drafting one token with the draft model, none verified, less target-only(n)
  prefill(m)    a step whose drafter first catches up on m tokens of one request, less the same step
Each point: `warmup` untimed runs, then the median of `repeats` timed ones; each curve made non-decreasing by
isotonic regression. `noise` holds each point's IQR / median; `meta["noise"]` sums it up.

`SeatedEngine` seats requests in KV slots 0..n-1 of one Engine at a real prefix (written into both models'
caches by their own prefill, once). A shape is one step of the first `rows` requests at `context` cached
tokens: `fed` rows propose their `drafts` real next tokens (`FedDrafter`, no forward) and verify them all;
`model` rows draft one token with the draft model and verify none; `behind` makes the drafter catch up
first. `rewind` (untimed) puts sequences, caches and the drafter's bookkeeping back before every run.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from avkit.config import EngineConfig, ProfileConfig, SamplingConfig
from avkit.drafters.base import Drafter, DraftInput, DraftProposal
from avkit.provenance import inputs_record
from avkit.runtime.engine import Engine
from avkit.runtime.prefill import prefill
from avkit.runtime.request import Request, RunningSeq
from avkit.scheduling.cost import CostTable, context_len_from_env, isotonic
from avkit.scheduling.policy import VerifyPolicy
from avkit.step_types import DraftBatch, Load, StepPlan


def write_prefix(model, cache, ids: list[int], rows: int) -> None:
    """Prefill `ids` into slot 0 (keys and values written by the model's prefill), then copy that slot's KV
    into slots 1..rows-1: every row reads a real prefix of len(ids) tokens."""
    if not ids:
        return
    prefill(lambda tokens, q_lens, slots, logits, host=None, prefill=False: model.forward(
        tokens, q_lens, slots, cache, logits=logits, host=host, prefill=prefill), [ids], [0], device=model.device,
        ragged=getattr(model, "ragged_prefill", False))
    cache.k[:, 1:rows], cache.v[:, 1:rows] = cache.k[:, :1], cache.v[:, :1]  # [L, rows-1, H, T, D]
    cache.lengths[:rows] = len(ids)


class FedDrafter(Drafter):
    """Proposes each row's `counts[b]` next tokens of the sequence it continues (`ids`), q one-hot: a
    deterministic drafter that runs no forward (its proposals are built once per shape and kept)."""

    kind = "fed"

    def __init__(self, ids: list[int], vocab_size: int):
        self.ids, self.vocab_size, self.counts = ids, vocab_size, ()
        self._kept: dict = {}

    def propose(self, inp: DraftInput) -> DraftProposal:
        b, k, dev = len(inp.sequences), inp.k, inp.slots.device
        key = (self.counts, b, k, inp.q_width(self.vocab_size), len(inp.sequences[0]))
        if key not in self._kept:
            tokens = torch.zeros(b, k, dtype=torch.int64)  # [B, K]
            for r, (seq, c) in enumerate(zip(inp.sequences, self.counts)):
                tokens[r, :c] = torch.tensor(self.ids[len(seq):len(seq) + c], dtype=torch.int64)
            counts = torch.tensor(self.counts, dtype=torch.int64)  # [B]
            probs = torch.zeros(b, k, key[3])  # [B, K, V] one-hot at the drafts ([B, K, 0] all greedy)
            if key[3]:
                probs.scatter_(2, tokens[:, :, None], (torch.arange(k)[None, :] < counts[:, None]).float()[:, :, None])
            self._kept[key] = DraftProposal(tokens.to(dev), probs.to(dev), torch.ones(b, k, device=dev), {},
                                            counts.to(dev), [self.kind] * b)
        return self._kept[key]


@dataclass
class _Shape(VerifyPolicy):
    """fed shapes verify every draft; model shapes draft one token per row and verify none."""

    model: bool = False
    name: str = "profile"

    def draft_limits(self, load: Load, lag, remaining):
        return [1] * load.num_requests if self.model else None

    def num_verify(self, batch: DraftBatch, load) -> StepPlan:
        return StepPlan(batch.num_drafted * 0 if self.model else batch.num_drafted.clone())


class SeatedEngine:
    """One Engine with `rows` requests seated at a real prefix of `ids` (module note); `step` times its steps."""

    def __init__(self, target, draft, ids: list[int], prefix: int, rows: int, k: int, sampling: SamplingConfig):
        self.ids, self.rows = ids, rows
        self.engine = Engine(target, draft, EngineConfig(k=max(k, 1), concurrency=rows, max_len=prefix + k + 8))
        self.engine.eos = frozenset()  # a profiled step never finishes its requests
        self.model_drafter = self.engine.drafter  # the draft model's DraftModelDrafter, or None
        self.fed = FedDrafter(ids, target.model.config.vocab_size)
        write_prefix(target.model, self.engine.cache, ids[:prefix], rows)
        if self.model_drafter is not None:
            write_prefix(draft.model, self.model_drafter.cache, ids[:prefix], rows)
        sampling = replace(sampling, max_new_tokens=1 << 30)
        self.seqs = [RunningSeq(r, i, [], 0, r.key) for i, r in
                     enumerate(Request(f"profile-{i}", ids[:prefix + 1], sampling) for i in range(rows))]
        self.engine.free_slots = []

    def step(self, rows: int, context: int, drafts: tuple[int, ...] | None = None,
             behind: int = 0) -> tuple[Callable[[], None], Callable[[], object]]:
        """(rewind, run) of one shape (module note): `drafts` per row for a fed step, None for a model step."""
        e, drafter = self.engine, self.model_drafter if drafts is None else self.fed
        policy = _Shape(model=drafts is None)
        seqs = self.seqs[:rows]

        def rewind():
            e.drafter, e.policy = drafter, policy
            self.fed.counts = drafts or ()
            for s in seqs:
                s.tokens[:] = self.ids[:context + 1]  # the cache holds all but the last token
            e.running = {s.req.request_id: s for s in seqs}
            e.cache.lengths[:rows] = context
            if drafts is None:  # positions [0, context) of the draft cache hold the prefix's keys
                drafter._have[:rows] = [context - behind] * rows  # its host mirror of cache.lengths
                drafter.cache.lengths[:rows] = context - behind
        return rewind, e.step


def request_grid(top: int) -> list[int]:
    """1, 2, 4, ... up to and including `top`."""
    return [1 << i for i in range(top.bit_length()) if 1 << i < top] + [top]


PRICE_GRID = (16, 64, 256, 512)  # tokens of one request the drafter prefills: a catch-up's price
DENSE_TOKENS = 32  # verify steps profiled at every token count up to here (the cost is a staircase, below)


def _token_grid(top: int) -> list[int]:
    """Verify step sizes: every count up to DENSE_TOKENS, then as `request_grid`. The cost is a staircase (the CPU
    kernel's 6-row tiles: 115 / 121 / 129 / 171 ms for 4-7 tokens at c4; GPU tiles and graph sizes): a
    power-of-two grid would interpolate across its steps."""
    return sorted({t for t in range(1, min(top, DENSE_TOKENS) + 1)} | set(request_grid(top)))


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


Timer = tuple[Callable[[], None], Callable[[], object]]  # (rewind, run): only `run` is timed


def _times_ms(timer: Timer, device: torch.device, repeats: int, warmup: int) -> list[float]:
    """`repeats` timed runs (ms) after `warmup` untimed ones, each after its untimed rewind."""
    rewind, run = timer
    for _ in range(warmup):
        rewind(), run()
    times = []
    for _ in range(repeats):
        rewind()
        _sync(device)
        t0 = time.perf_counter()
        run()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


NOISY_SPREAD = 0.05  # a point whose repeats' IQR exceeds this share of their median is noisy (~3.7% sd if normal)
NOISY_MOVE = 0.05  # the isotonic fit moving a point's median by more than this means the curve contradicts itself


def spread(runs) -> float:
    """A point's noise: the interquartile range of its repeats over their median (0 for one repeat)."""
    q1, med, q3 = np.percentile(np.asarray(runs, dtype=np.float64), [25, 50, 75])
    return float((q3 - q1) / med) if med > 0 else 0.0


def noise_summary(curves: dict[str, tuple[list[int], list[list[float]]]]) -> dict:
    """How much a profile's repeated runs disagree. curves: name -> (grid [P], timed runs [P][repeats]).

    points: name -> [P] spread of each point (IQR / median, written per point into the cost file);
    moved: (curve, x, change) where the isotonic fit (the monotone table) moved a point's median, i.e. the
    measured curve went down there. -> {points, median_spread, max_spread, worst, moved, noisy}.

    Examples
    --------
    >>> s = noise_summary({"verify_ms": ([1, 2, 4], [[1.0, 1.0], [3.0, 2.0], [2.0, 2.0]])})
    >>> s["points"]["verify_ms"], s["worst"], s["moved"], s["noisy"]
    ([0.0, 0.2, 0.0], 'verify_ms=2', [('verify_ms', 2, -0.1), ('verify_ms', 4, 0.125)], True)
    """
    points, spreads, moved = {}, [], []
    for name, (grid, runs) in curves.items():
        points[name] = [round(spread(r), 4) for r in runs]
        medians = [statistics.median(r) for r in runs]
        fitted = isotonic(medians)
        for x, m, fit, sp in zip(grid, medians, fitted.tolist(), points[name]):
            spreads.append((sp, f"{name}={x}"))
            if m > 0 and abs(fit / m - 1) > 1e-9:
                moved.append((name, x, round(fit / m - 1, 4)))
    if not spreads:
        return {"points": points, "median_spread": 0.0, "max_spread": 0.0, "worst": "", "moved": [], "noisy": False}
    worst = max(spreads)
    med = statistics.median(v for v, _ in spreads)
    noisy = worst[0] > NOISY_SPREAD or any(abs(change) > NOISY_MOVE for _, _, change in moved)
    return {"points": points, "median_spread": round(med, 4), "max_spread": round(worst[0], 4), "worst": worst[1],
            "moved": moved, "noisy": noisy}


def _time_points(timers, device, config, on_point) -> tuple[list[float], list[list[float]]]:
    """Warm every timer, then time each in turn: (median ms per point, every run's ms per point)."""
    for _ in range(config.warmup):  # every point untimed first: a cold process's first point ran ~25% slow
        for rewind, run in timers:
            rewind(), run()
    ms, runs = [], []
    for timer in timers:
        runs.append(_times_ms(timer, device, config.repeats, config.warmup))
        ms.append(statistics.median(runs[-1]))
        if on_point:
            on_point()
    return ms, runs


def prompt_tokens(loaded, count: int, seed: int = 0) -> list[int]:
    """`count` real prompt tokens: HumanEval prompts through the model's tokenizer, one after another (a tiny
    test model, or random weights, without a tokenizer that encodes: seeded token ids of its vocabulary)."""
    tok, vocab = getattr(loaded, "tokenizer", None), loaded.model.config.vocab_size
    ids: list[int] = []
    if callable(getattr(tok, "encode", None)):
        from avkit.workloads import load_workload  # lazy: the prompt sets load only when a profile runs

        for prompt in load_workload("humaneval"):
            ids += [t for t in tok.encode(prompt.text or "") if t < vocab]
            if len(ids) >= count:
                return ids[:count]
    g = torch.Generator().manual_seed(seed)
    return (ids + torch.randint(0, vocab, (count,), generator=g).tolist())[:count]


def _verify_layout(tokens: int, k: int) -> tuple[int, int]:
    """T tokens -> (requests, query tokens per request) with requests * q >= T, q <= k + 1."""
    requests = -(-tokens // (k + 1))
    return requests, -(-tokens // requests)


def _less(runs: list[list[float]], base: list[float]) -> tuple[list[float], list[list[float]]]:
    """Each point's runs minus its base point's median: (median ms >= 0 per point, runs per point)."""
    runs = [[r - b for r in rs] for rs, b in zip(runs, base)]
    return [max(0.0, statistics.median(rs)) for rs in runs], runs


def per_request(t_grid, verify_ms, d_grid, target_only_ms, k: int) -> tuple[list[float], list[float]]:
    """(request_ms on d_grid, verify_ms holding one request) from verify points laid out ceil(T / (k + 1))
    requests per step and target-only steps of n requests (T = n): request_ms(n) = target_only(n) -
    verify(n) + request_ms(ceil(n / (k + 1))) with request_ms(1) = 0, in increasing n; both made
    non-decreasing (isotonic), the verify curve never below its one-token point (a noisy request point).

    >>> per_request([1, 2, 4], [10.0, 11.0, 12.0], [1, 2, 4], [10.0, 12.0, 16.0], 3)
    ([0.0, 1.0, 4.0], [10.0, 11.0, 12.0])
    >>> per_request([1, 2, 4, 8], [10.0, 11.0, 12.0, 20.0], [1, 2, 4, 8], [10.0, 12.0, 16.0, 40.0], 3)[1]
    [10.0, 11.0, 12.0, 19.0]
    >>> per_request([1, 2, 4, 8], [10.0, 11.0, 12.0, 20.0], [1, 2, 4, 8], [10.0, 30.0, 30.0, 40.0], 3)[1]
    [10.0, 11.0, 11.0, 11.0]
    """
    req: list[float] = []
    for n, ms in zip(d_grid, target_only_ms):
        held = float(np.interp(-(-n // (k + 1)), d_grid[:len(req)], req)) if req and n > 1 else 0.0
        req.append(0.0 if n <= 1 else max(0.0, ms - float(np.interp(n, t_grid, verify_ms)) + held))
    req = isotonic(req).tolist()
    layout = -(-np.asarray(t_grid) // (k + 1))  # [P] requests of each verify point
    verify = np.asarray(verify_ms) - np.interp(layout, d_grid, req)  # [P] one request's
    return req, isotonic(np.maximum(verify, isotonic(verify_ms)[0])).tolist()  # never below one token's


def profile_costs(target, draft, config: ProfileConfig, *, on_point: Callable[[], None] | None = None) -> CostTable:
    """The cost table of `target` and `draft` (LoadedModels) from the engine's own step at every point (module note)."""
    context = context_len_from_env(config.context_len)
    t_grid, d_grid = _token_grid(config.max_verify_tokens), request_grid(config.max_requests)
    rows = max(_verify_layout(config.max_verify_tokens, config.k)[0], config.max_requests)
    prefix = max(context, PRICE_GRID[-1])
    ids = prompt_tokens(target, prefix + config.k + 2)  # the prefix and the tokens that continue it
    seated = SeatedEngine(target, draft, ids, prefix, rows, config.k, config.sampling)
    dev = target.model.device

    def verify_point(t: int):
        n, q = _verify_layout(t, config.k)
        return seated.step(n, context, (q - 1,) * (n - 1) + (t - q * (n - 1) - 1,))
    verify_ms, verify_runs = _time_points([verify_point(t) for t in t_grid], dev, config, on_point)
    draft_ms, draft_runs, prefill_ms, prefill_runs, request_ms = [0.0] * len(d_grid), [], [], [], ()
    verify_fit = isotonic(verify_ms).tolist()
    if draft is not None:
        base, _ = _time_points([seated.step(n, context, (0,) * n) for n in d_grid], dev, config, on_point)
        request_ms, verify_fit = per_request(t_grid, verify_ms, d_grid, base, config.k)
        draft_ms, draft_runs = _less(_time_points([seated.step(n, context) for n in d_grid], dev, config,
                                                  on_point)[1], base)
        base, _ = _time_points([seated.step(1, m) for m in PRICE_GRID], dev, config, on_point)
        prefill_ms, prefill_runs = _less(_time_points([seated.step(1, m, behind=m) for m in PRICE_GRID], dev,
                                                      config, on_point)[1], base)
    noise = noise_summary({"verify_ms": (t_grid, verify_runs), "draft_ms": (d_grid, draft_runs),
                           **({"prefill_ms": (list(PRICE_GRID), prefill_runs)} if prefill_runs else {})})
    meta = {"source": "profile", "device": device_name(dev), "target": target.model_id,
            "target_sha256": target.sha256, "draft": draft.model_id if draft else "",
            "draft_sha256": draft.sha256 if draft else "", "context_len": context, "k": config.k,
            "temperature": config.sampling.temperature, "top_p": config.sampling.top_p, "timed": "engine step",
            "repeats": config.repeats, "dtype": str(target.model.dtype).removeprefix("torch."),
            "raw_verify_ms": verify_ms, "raw_draft_ms": draft_ms,
            "noise": noise,
            "inputs": inputs_record("avkit profile"),  # avkit version and time (avkit/provenance.py)
            **memory_meta(target.model, draft.model if draft else None)}
    return CostTable(tuple(t_grid), tuple(verify_fit), tuple(d_grid),
                     tuple(isotonic(draft_ms).tolist()), (), "autoregressive", meta,
                     prefill_tokens=PRICE_GRID if prefill_ms else (),
                     prefill_ms=tuple(isotonic(prefill_ms).tolist()) if prefill_ms else (),
                     context_len=context, noise=noise.pop("points"), request_ms=tuple(request_ms))


def num_points(config: ProfileConfig, with_draft: bool) -> int:
    return len(_token_grid(config.max_verify_tokens)) + (2 * (len(request_grid(config.max_requests)) + len(PRICE_GRID))
                                                   if with_draft else 0)


def memory_meta(target, draft=None) -> dict:
    """What `avkit tune` needs to tell whether a batch fits: the device's memory, both models' weights, and
    the KV bytes each context token costs in the target and the drafter (at the models' dtype)."""
    models = [m for m in (target, draft) if m is not None]
    weights = sum(p.numel() * p.element_size() for m in models for p in m.parameters())
    kv = sum(2 * m.config.num_layers * m.config.num_kv_heads * m.config.head_dim * m.dtype.itemsize for m in models)
    if target.device.type == "cuda":
        memory = torch.cuda.get_device_properties(target.device).total_memory
    else:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"memory_gb": memory / 1e9, "weights_gb": weights / 1e9, "kv_bytes_per_token": float(kv)}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {platform.processor() or platform.machine()} x{torch.get_num_threads()} threads"
