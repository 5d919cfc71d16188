"""The GPU check's engine and profile steps, on random-weight models built on the device: greedy speculative ==
target-only, a chi-square of T = 1 outputs, kernels="triton" == "torch" under an adaptive policy, and
`profile_costs` in the real pair's and an 8B shape (docs/gpu.md: pass criteria and what each number decides)."""

from __future__ import annotations

import time
import traceback

import numpy as np
import torch

from avkit.config import DEFAULT_K, AdaptiveConfig, EngineConfig, EstimatorConfig, ProfileConfig, SamplingConfig
from avkit.models import LoadedModel, ModelConfig, Transformer
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.runtime.trace_rows import MemorySink
from avkit.scheduling.adaptive import make_adaptive
from avkit.scheduling.cost import CostTable
from avkit.scheduling.profile import PRICE_GRID, memory_meta, profile_costs

_QWEN = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 151_936, "tie_word_embeddings": True,
         "rope_theta": 1e6}
QWEN_15B = {**_QWEN, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
            "num_attention_heads": 12, "num_key_value_heads": 2}  # Qwen2.5-Coder-1.5B: the real target
QWEN_05B = {**_QWEN, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2}  # Qwen2.5-Coder-0.5B: the real draft
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "vocab_size": 128_256, "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "rope_theta": 5e5}  # Llama-3.1-8B (roofline's "8b")


def tiny(vocab: int) -> dict:
    return {"architectures": ["Qwen2ForCausalLM"], "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


SHAPES = {"pair": (QWEN_15B, QWEN_05B), "8b": (LLAMA_8B, QWEN_05B),  # 8B target, the real draft (as roofline)
          "tiny": (tiny(512), tiny(512))}  # the dry run's


class _NoEos:
    eos_token_ids = frozenset()  # random models would stop at random; every check wants full-length outputs


def random_model(shape: dict, device, dtype, seed: int, std: float, noise: float = 0.0) -> LoadedModel:
    """A Transformer of `shape` (a HF config.json dict) with N(0, std) matrices, embeddings and biases, unit
    norm gains, built on `device`; `noise` > 0 adds noise x each matrix's std of seeded Gaussian noise (a
    draft that agrees with the same seed's target often, not always)."""
    cfg = ModelConfig.from_hf(shape)
    with torch.device("meta"):
        model = Transformer(cfg).to(dtype)
    model = model.to_empty(device=device)
    g, g_noise = torch.Generator(device=device).manual_seed(seed), torch.Generator(device=device).manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and not name.endswith("bias"):
                p.fill_(1.0)
                continue
            p.normal_(0.0, std, generator=g)
            if noise and p.dim() > 1:
                p.add_(noise * p.float().std().to(dtype) * torch.randn(p.shape, generator=g_noise, device=device,
                                                                        dtype=dtype))
    model = model.eval().requires_grad_(False)
    model.pack_for_cpu()  # what avkit.models.load does (a no-op but for CPU + bf16)
    return LoadedModel(model, _NoEos(), f"random {cfg.arch} d={cfg.hidden_size} L={cfg.num_layers}", f"seed {seed}")


def _ids(gens) -> list[list[int]]:
    return [g.output_ids for g in gens]


def greedy(target, draft) -> dict:
    reqs = [Request(f"g{i}", [(7 * i + j) % 250 + 5 for j in range(3 + i % 5)],
                    SamplingConfig(temperature=0.0, max_new_tokens=24)) for i in range(8)]
    ref = _ids(Engine(target, None, EngineConfig(k=0, concurrency=4, max_len=96)).generate(reqs))
    per_k, accepted, verified = {}, 0, 0
    for k in (1, 4, 7):
        sink = MemorySink()
        got = _ids(Engine(target, draft, EngineConfig(k=k, concurrency=4, max_len=96), sink=sink).generate(reqs))
        cols = sink.columns()
        a, v = int(np.ma.filled(cols["accepted"], False).sum()), int(np.asarray(cols["verified"]).sum())
        per_k[k] = {"equal": got == ref, "accepted": a, "verified": v}
        accepted, verified = accepted + a, verified + v
    # both outcomes must occur, or the comparison proves nothing about rejection
    return {"ok": all(r["equal"] for r in per_k.values()) and 0 < accepted < verified, "per_k": per_k}


def _pooled(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[2, V] counts -> [2, C]: columns with fewer than 10 draws in all pooled into one (or into the smallest kept)."""
    table = np.stack([a, b]).astype(np.float64)
    tot = table.sum(0)
    kept, pool = table[:, tot >= 10], table[:, (tot > 0) & (tot < 10)].sum(1, keepdims=True)
    if pool.sum() >= 10 or kept.shape[1] == 0:
        return np.concatenate([kept, pool], 1)
    kept[:, np.argmin(kept.sum(0))] += pool[:, 0]
    return kept


def chi_square(target, draft, n: int) -> dict:
    from scipy.stats import chi2_contingency

    def first_tokens(d, k, seed):  # [n, 3]
        reqs = [Request(f"s{i}", [40, 41, 42, 43, 44], SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=3,
                                                                        seed=seed)) for i in range(n)]
        return np.array(_ids(Engine(target, d, EngineConfig(k=k, concurrency=min(n, 256), max_len=16)).generate(reqs)))

    spec, base = first_tokens(draft, 3, 7), first_tokens(None, 0, 8)
    vocab = target.model.config.vocab_size
    rows = []
    for j in range(3):
        table = _pooled(np.bincount(spec[:, j], minlength=vocab), np.bincount(base[:, j], minlength=vocab))
        if table.shape[1] < 2:  # one token takes all the mass: nothing to test
            rows.append({"position": j, "columns": int(table.shape[1]), "chi2": 0.0, "dof": 0, "p_value": 1.0})
            continue
        stat, p, dof, _ = chi2_contingency(table)
        rows.append({"position": j, "columns": int(table.shape[1]), "chi2": float(stat), "dof": int(dof),
                     "p_value": float(p)})
    return {"ok": all(r["p_value"] > 1e-3 for r in rows), "requests": n, "positions": rows}


def backends(target, draft) -> dict:
    out = {}
    for temperature in (0.0, 1.0):
        runs = {}
        for backend in ("torch", "triton"):
            cost = CostTable((1, 64), (1.0, 1.0 + 63 * 0.2), (1, 64), (0.2, 0.2))  # verifying costs: some trimmed
            policy = make_adaptive(cost=cost, estimator="online_logistic", k=4, config=EstimatorConfig(refit_interval=3),
                                   adaptive=AdaptiveConfig(draft_gate=False), stop_drafting=True)
            sink = MemorySink()
            engine = Engine(target, draft, EngineConfig(k=4, concurrency=4, max_len=48, kernels=backend), policy=policy,
                            sink=sink)
            reqs = [Request(f"r{i}", [10 + i, 11, 12 + 3 * i, 7],
                            SamplingConfig(temperature=temperature, top_p=0.9, max_new_tokens=12, seed=3)) for i in range(6)]
            runs[backend] = (_ids(engine.generate(reqs)), sink.columns(), engine.kernels.backend, policy.refits)
        (ids_t, cols_t, name_t, refits), (ids_k, cols_k, name_k, _) = runs["torch"], runs["triton"]
        differ = [c for c in cols_t if c != "step_time_ms" and not _same_column(cols_k.get(c), cols_t[c])]
        trimmed = np.asarray(cols_t["verified"], dtype=bool)
        out[f"T={temperature:g}"] = {"backends": [name_t, name_k], "tokens_equal": ids_k == ids_t,
                                     "columns_differing": differ, "refits": refits,
                                     "verified_share": float(trimmed.mean())}
    ok = all(r["backends"] == ["torch", "triton"] and r["tokens_equal"] and not r["columns_differing"]
             and r["refits"] >= 1 and 0 < r["verified_share"] < 1 for r in out.values())
    return {"ok": ok, **out}


def _same_column(got, want) -> bool:
    """Masks equal; floats within 1e-5 (the confidence kernel sums in another order), the rest exact."""
    if got is None or not np.array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(want)):
        return False
    g, w = np.ma.getdata(got), np.ma.getdata(want)
    if np.asarray(w).dtype.kind == "f":
        return bool(np.allclose(g, w, rtol=0, atol=1e-5, equal_nan=True))
    return bool(np.array_equal(g, w))


def engine_step(ctx, limit: float) -> dict:
    """The step (ctx: gpu_check's Check): every engine check, each guarded; engine.json rewritten after each."""
    device, vocab, n_chi2 = ctx.device, ctx.sizes.engine_vocab, ctx.sizes.chi2_requests
    target = random_model(tiny(vocab), device, torch.float32, seed=0, std=0.3)
    draft = random_model(tiny(vocab), device, torch.float32, seed=0, std=0.3, noise=0.05)  # accepted often
    other = random_model(tiny(vocab), device, torch.float32, seed=5, std=0.3)  # unrelated: doubtful drafts, trimmed
    checks = {}
    for name, fn in (("greedy", lambda: greedy(target, draft)), ("chi_square_t1", lambda: chi_square(target, draft, n_chi2)),
                     ("triton_vs_torch", lambda: backends(target, other))):  # the hybrid drafter: the pytest step
        t0 = time.perf_counter()
        try:
            checks[name] = fn()
        except Exception as e:  # the other checks still run
            checks[name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        checks[name]["seconds"] = round(time.perf_counter() - t0, 2)
        ctx.write_json("engine.json", checks)
    return {"ok": all(c["ok"] for c in checks.values()), **{k: c["ok"] for k, c in checks.items()}}


def _fit_concurrency(target, draft, context: int, top: int) -> int:
    """The largest power of two <= top whose caches and verify logits fit in 80% of the device's free memory."""
    if target.model.device.type != "cuda":
        return top
    free = torch.cuda.mem_get_info(target.model.device)[0]
    kv = memory_meta(target.model, draft.model)["kv_bytes_per_token"]  # target + draft, per context token
    per_request = (context + max(DEFAULT_K + 2, PRICE_GRID[-1])) * kv + (DEFAULT_K + 1) * target.model.config.vocab_size * 16
    c = top
    while c > 1 and c * per_request > 0.8 * free:
        c //= 2
    return c


def profile_shape(name: str, device, sizes, path) -> dict:
    """Profile random weights in SHAPES[name] (bf16 on CUDA, float32 on a CPU) at T = 0 (the greedy traces'),
    save the cost table to `path`; -> the headline numbers."""
    t_shape, d_shape = SHAPES[name]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    target = random_model(t_shape, device, dtype, seed=0, std=0.02)
    draft = random_model(d_shape, device, dtype, seed=2, std=0.02)
    build_s = time.perf_counter() - t0
    c = _fit_concurrency(target, draft, sizes.context, sizes.max_concurrency)
    config = ProfileConfig(context_len=sizes.context, k=DEFAULT_K, max_verify_tokens=c * (DEFAULT_K + 1), max_requests=c,
                           repeats=sizes.repeats, sampling=SamplingConfig(temperature=0.0))
    t0 = time.perf_counter()
    table = profile_costs(target, draft, config)
    table.save(path)
    del target, draft
    if device.type == "cuda":
        torch.cuda.empty_cache()
    v, d = dict(zip(table.verify_tokens, table.verify_ms)), dict(zip(table.draft_requests, table.draft_ms))
    return {"file": path.name, "build_s": round(build_s, 1), "profile_s": round(time.perf_counter() - t0, 1),
            "max_concurrency": c, "context": sizes.context, "verify_ms": {t: v[t] for t in sorted({1, 8, 64, c * 8} & set(v))},
            "draft_ms": {n: d[n] for n in sorted({1, c} & set(d))}, "draft_over_verify_at_1": d[1] / v[1],
            "noise": table.meta.get("noise", {}).get("median_spread")}




def profile_step(ctx, limit: float) -> dict:
    """The step: each of the run's shapes profiled -> cost_<shape>.json, profile.json rewritten after each."""
    out = {}
    for name in ctx.sizes.shapes:
        out[name] = profile_shape(name, ctx.device, ctx.sizes, ctx.out / f"cost_{name}.json")
        ctx.write_json("profile.json", out)
    return {"ok": True, **out}
