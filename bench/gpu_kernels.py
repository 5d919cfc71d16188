"""The GPU check's kernels step: each Triton kernel against its torch reference at real sizes, both timed, with
the bandwidth each reaches against the peak the device reports (docs/gpu.md: what each number decides)."""

from __future__ import annotations

import subprocess
import time
from functools import partial

import torch

from avkit.kernels.confidence import confidence_triton
from avkit.kernels.dispatch import select_kernels
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
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * sorted(times)[1]


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
