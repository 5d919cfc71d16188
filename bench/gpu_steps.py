"""The GPU check's steps (bench/gpu_check.py; docs/gpu.md: pass criteria and what each number decides).

kernels  each Triton kernel against its torch reference at real sizes, both timed, with the bandwidth each
         reaches against the peak the device reports
engine   on random-weight models built on the device: greedy speculative == target-only, a chi-square of
         T = 1 outputs, kernels="triton" == "torch" under an adaptive policy
profile  `profile_costs` in the real pair's and an 8B shape
"""

from __future__ import annotations

import subprocess
import time
import timeit
import traceback
from functools import partial

import numpy as np
import torch

from avkit.config import DEFAULT_K, AdaptiveConfig, EngineConfig, EstimatorConfig, ProfileConfig, SamplingConfig
from avkit.kernels.confidence import confidence_triton
from avkit.kernels.dispatch import select_kernels
from avkit.models import LoadedModel, ModelConfig, Transformer
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.runtime.trace_rows import MemorySink
from avkit.scheduling.adaptive import make_adaptive
from avkit.scheduling.cost import CostTable
from avkit.scheduling.profile import PRICE_GRID, memory_meta, profile_costs
from avkit.scheduling.roofline import MODELS, Accelerator, forward_ms

K = 7  # draft length
# every field of Confidence, the same tolerances as tests/test_kernels_confidence.py
ATOL = {"logit_qmax": 2e-5, "q_max": 1e-6, "q_2nd": 1e-6, "entropy": 1e-5, "confidence": 1e-6,
        "log_margin": 2e-5, "neg_log_neg_log_qmax": 5e-5}


def bench_ms(fn, device: torch.device) -> float:
    """Median ms per call: triton's do_bench on CUDA; the middle of three timed calls elsewhere (dry runs)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=10, rep=50, return_mode="median"))
    fn()
    return 1e3 * sorted(timeit.repeat(fn, repeat=3, number=1))[1]


def _nvml_memory() -> tuple[float, int]:
    """(max memory clock MHz, bus width bits) from NVML (nvidia-ml-py), device 0."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return float(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)), int(pynvml.nvmlDeviceGetMemoryBusWidth(h))
    finally:
        pynvml.nvmlShutdown()


def _cupy_memory() -> tuple[float, int]:
    import cupy

    p = cupy.cuda.runtime.getDeviceProperties(0)
    return p["memoryClockRate"] / 1e3, int(p["memoryBusWidth"])  # kHz -> MHz


def device_bandwidth(device: torch.device) -> dict:
    """What the device says about its memory: peak TB/s = 2 (double data rate) x clock x bus width / 8,
    the source it came from, and a measured copy's TB/s (bytes read + written). Empty on a CPU."""
    if device.type != "cuda":
        return {"peak_tb_s": None, "source": "no CUDA device", "copy_tb_s": None}
    props = torch.cuda.get_device_properties(device)
    clock_khz, bus = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    sources = [("torch.cuda.get_device_properties", lambda: (clock_khz / 1e3, bus)),
               ("nvml", _nvml_memory), ("cupy", _cupy_memory)]
    info = {"peak_tb_s": None, "source": "none answered", "errors": []}
    for name, read in sources:
        try:
            mhz, bits = read()
        except Exception as e:  # a missing module or an old driver: try the next source
            info["errors"].append(f"{name}: {type(e).__name__}: {e}")
            continue
        if mhz > 0 and bits > 0:
            info.update(peak_tb_s=2 * mhz * 1e6 * bits / 8 / 1e12, source=name, memory_clock_mhz=mhz,
                        bus_width_bits=bits)
            break
        info["errors"].append(f"{name}: clock {mhz} MHz, bus {bits} bits")
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.max.memory,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        info["nvidia_smi"] = f"{type(e).__name__}: {e}"
    x = torch.empty(1 << 28, dtype=torch.float32, device=device)  # 1 GiB
    y = torch.empty_like(x)
    info["copy_tb_s"] = 2 * x.numel() * 4 / (bench_ms(lambda: y.copy_(x), device) * 1e-3) / 1e12
    return info


def matmul_tflops(device: torch.device, n: int) -> float:
    """Dense matmul rate of an n x n x n product (bf16 on CUDA, fp32 elsewhere), TFLOP/s."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n ** 3 / (bench_ms(lambda: a @ b, device) * 1e-3) / 1e12


# A case: make(B, V, g, *extra) -> (kernel name, args, kwargs); check(got, want, args, kwargs) -> (ok, detail,
# bytes the kernel moves)
def confidence_case(B, V, g, dtype):
    x = (torch.randn(B, K, V, device=g.device, generator=g) * 3).to(dtype)  # [B, K, V] draft logits
    return "confidence", (x, torch.rand(B, device=g.device, generator=g) + 0.5, torch.arange(K, device=g.device),
                          0.5, torch.linspace(-1, 0.5, K, device=g.device)), {}


def confidence_check(got, want, args, kw):
    err = {n: float((getattr(got, n) - getattr(want, n)).abs().max()) for n in got._fields}
    return all(err[n] <= ATOL[n] for n in err), err, args[0].numel() * args[0].element_size()  # logits read once


def rejection_case(B, V, g, greedy):
    lt = torch.randn(B, K + 1, V, device=g.device, generator=g) * 2
    tp = lt.softmax(-1)  # [B, K+1, V]
    dp = (lt[:, :K] + torch.randn(B, K, V, device=g.device, generator=g)).softmax(-1)  # [B, K, V]
    x = torch.multinomial(dp.reshape(-1, V), 1, generator=g).reshape(B, K)
    if greedy:
        x = torch.where(torch.rand(B, K, device=g.device, generator=g) < 0.8, tp[:, :K].argmax(-1), x)
    return "rejection_sample", (tp, dp, x, torch.randint(0, K + 1, (B,), device=g.device, generator=g)), {
        "greedy": greedy, "seeds": torch.randint(0, 2**40, (B,), device=g.device, generator=g),
        "request_keys": torch.arange(B, device=g.device), "positions": torch.zeros(B, dtype=torch.int64, device=g.device)}


def rejection_check(got, want, args, kw):
    bad_rows = int((got.output_tokens != want.output_tokens).any(1).sum())
    ok = bad_rows == 0 and all(torch.equal(getattr(got, f), getattr(want, f))
                               for f in ("num_accepted", "observed", "accepted"))
    n = want.num_accepted  # greedy reads rows 0..k; else p_n (+ q_n)
    rows_read = (n + 1).sum() if kw["greedy"] else len(n) + (n < args[3]).sum()
    return ok, {"rows_differing": bad_rows}, int(rows_read) * args[0].shape[-1] * 4


def irls_case(B, V, g):
    n = B * K  # one engine step of slots
    f = torch.randn(n, device=g.device, generator=g) * 3
    p = torch.sigmoid(0.5 * f - 0.2)
    y = (torch.rand(n, device=g.device, generator=g) < p).float()
    obs = torch.rand(n, device=g.device, generator=g) < 0.7
    return "irls_stats", (f, torch.arange(n, device=g.device) % K, p, y, obs, K), {}


def irls_check(got, want, args, kw):
    err = max(float(((getattr(got, s) - getattr(want, s)).abs() / (getattr(want, s).abs() + 1e-4)).max())
              for s in ("a", "b", "c", "g0", "g1"))
    nbytes = args[0].numel() * 21  # fp32 f, p, y + int64 position + bool observed
    return err < 1e-4 and torch.equal(got.n, want.n), {"max_rel_err": err}, nbytes


def allocation_case(B, V, g):
    c = torch.randint(0, 9, (B, K), device=g.device, generator=g).float() / 8  # ties on purpose
    nd = torch.randint(0, K + 1, (B,), device=g.device, generator=g)
    return "allocate", (c, nd, torch.tensor([max(B * K // 3, 1)], device=g.device)), {}


def allocation_check(got, want, args, kw):
    ok = torch.equal(got.num_verify, want.num_verify) and torch.equal(got.survival, want.survival)
    return ok, {}, args[0].numel() * 12  # confidences in, survival out, survival re-read


CASES = [("confidence fp32", confidence_case, confidence_check, (torch.float32,)),
         ("confidence bf16", confidence_case, confidence_check, (torch.bfloat16,)),
         ("rejection", rejection_case, rejection_check, (False,)),
         ("rejection greedy", rejection_case, rejection_check, (True,)),
         ("irls_stats", irls_case, irls_check, ()),
         ("allocation", allocation_case, allocation_check, ())]


def run_all(device: torch.device, batches, V: int, peak_tb_s: float | None, on_case) -> list[dict]:
    """Check every kernel against its reference at each batch size and time both; `on_case(rows so far)` after
    each row (the check writes partial results through it)."""
    kernels, refs = select_kernels(device, backend="triton"), select_kernels(device, backend="torch")
    g = torch.Generator(device=device).manual_seed(0)
    cases = []
    for B in batches:
        for name, make, check, extra in CASES:
            fn, args, kw = make(B, V, g, *extra)
            tri, ref = (partial(getattr(backend, fn), *args, **kw) for backend in (kernels, refs))
            ok, detail, nbytes = check(tri(), ref(), args, kw)
            t_tri, t_ref = bench_ms(tri, device), bench_ms(ref, device)
            tb_s = nbytes / (t_tri * 1e-3) / 1e12
            cases.append({"kernel": name, "B": B, "K": K, "V": V, "correct": bool(ok), "detail": detail,
                          "triton_ms": t_tri, "ref_ms": t_ref, "speedup": t_ref / t_tri, "bytes": nbytes,
                          "tb_s": tb_s, "pct_peak": 100 * tb_s / peak_tb_s if peak_tb_s else None})
            on_case(cases)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return cases


def sweep_confidence(device: torch.device, B: int, V: int, peak_tb_s: float | None):
    """Launch configurations of the bf16 confidence kernel at batch B (to pick the launcher's defaults)."""
    x = (torch.randn(B, K, V, device=device) * 3).to(torch.bfloat16)
    args = (x, 1.0, torch.arange(K, device=device), 0.5, torch.zeros(K, device=device))
    rows = []
    for block_v in (2048, 4096, 8192):
        for warps in (4, 8):
            ms = bench_ms(lambda b=block_v, w=warps: confidence_triton(*args, block_v=b, num_warps=w), device)
            tb_s = x.numel() * x.element_size() / (ms * 1e-3) / 1e12
            rows.append({"block_v": block_v, "num_warps": warps, "ms": ms, "tb_s": tb_s,
                         "pct_peak": 100 * tb_s / peak_tb_s if peak_tb_s else None})
    return rows


def hot_path(cases, B: int, tb_s: float | None, tflops: float) -> dict:
    """The Triton hot path of one step at batch B vs an 8B target's roofline verify step at 8192 tokens of
    context on this device (its measured copy bandwidth and matmul rate)."""
    at = {c["kernel"]: c["triton_ms"] for c in cases if c["B"] == B}
    path = at["confidence bf16"] + at["allocation"] + at["rejection"] + at["irls_stats"]
    out = {"batch": B, "hot_path_ms": path, "matmul_tflops": tflops}
    if tb_s:
        verify = float(forward_ms(MODELS["8b"], Accelerator("this device", tflops, tb_s, 0.05), B * (K + 1), B, 8192))
        out.update(verify_step_8b_ms=verify, share_pct=100 * path / verify)
    return out


def kernels_step(ctx, limit: float) -> dict:
    """The step (ctx: gpu_check's Check): bandwidth, matmul rate, every case, the hot path and the launch sweep ->
    kernels.json."""
    device, batches, vocab = ctx.device, ctx.sizes.batches, ctx.sizes.vocab
    bw, tflops = device_bandwidth(device), matmul_tflops(device, ctx.sizes.matmul_n)
    head = {"bandwidth": bw, "matmul_tflops": tflops}
    write_json = partial(ctx.write_json, "kernels.json")
    cases = run_all(device, batches, vocab, bw["peak_tb_s"], lambda rows: write_json({**head, "cases": rows}))
    hot = hot_path(cases, max(batches), bw["copy_tb_s"], tflops)
    write_json({**head, "cases": cases, "hot_path": hot,
                "confidence_sweep": sweep_confidence(device, max(batches), vocab, bw["peak_tb_s"])})
    conf = next(c for c in cases if c["kernel"] == "confidence bf16" and c["B"] == max(batches))
    return {"ok": all(c["correct"] for c in cases), "wrong": [(c["kernel"], c["B"]) for c in cases if not c["correct"]],
            "peak_tb_s": bw["peak_tb_s"], "peak_source": bw["source"], "copy_tb_s": bw["copy_tb_s"],
            "matmul_tflops": tflops, "confidence_bf16_pct_peak": conf["pct_peak"], "hot_path": hot}


# ---- engine and profile ----------------------------------------------------------------------------------
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
        # one token takes all the mass: nothing to test
        stat, p, dof, _ = chi2_contingency(table) if table.shape[1] >= 2 else (0.0, 1.0, 0, None)
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
