"""GPU check: one prepared run that proves avkit's GPU runtime the first time a device is lent (docs/gpu.md).

    python bench/gpu_check.py                     # a CUDA machine: <= 8 min -> bench/results/gpu/<date>-<gpu>/
    python bench/gpu_check.py --dry-run           # the same code on this CPU at tiny sizes (tests/test_gpu_check.py)
    python bench/gpu_check.py --steps profile,sim --out DIR   # rerun some steps into the same directory

Steps, in order, each timed, guarded (an error is recorded and the next step runs) and bounded (its own time
limit plus what earlier steps left, inside --budget-s): pytest (the `gpu`-marked tests), kernels (each Triton
kernel vs its torch reference, timed against the device's own peak bandwidth), engine (tiny random models on
the device: greedy == target-only, a chi-square at T = 1, Triton == torch under an adaptive policy), profile
(`profile_costs` on random weights in the real pair's and an 8B shape), sim (`avkit hvd`, then `avkit tune`
per measured table). What each runs, its pass criteria and what each number decides: docs/gpu.md.
Outputs: summary.json (rewritten after every step; kernels.json and engine.json after every row), one file
per step, logs; --bundle PATH packs the directory into PATH after every step, so a run cut short returns files.
On a CPU (--dry-run) the same code runs at tiny sizes under Triton's interpreter; bandwidths are left empty.
The device image has no polars: it travels as the wheel in WHEELS (docs/gpu.md has the command line).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from xml.etree import ElementTree

if "--dry-run" in sys.argv[1:]:  # before torch or triton is imported: Triton runs interpreted on the CPU, the
    os.environ.update(TRITON_INTERPRET="1", AVKIT_CPU_KERNELS="0",  # CPU's C++ kernels stay off (a GPU never
                      OMP_NUM_THREADS="1")  # runs them; no build in CI); tiny models: one thread
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the device runs a copy of the tree: avkit is not installed there

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

from avkit.config import (DEFAULT_K, AdaptiveConfig, EngineConfig, EstimatorConfig, ProfileConfig,  # noqa: E402
                          SamplingConfig)
from avkit.kernels.confidence import confidence_triton  # noqa: E402
from avkit.kernels.dispatch import select_kernels  # noqa: E402
from avkit.models import LoadedModel, ModelConfig, Transformer  # noqa: E402
from avkit.runtime.engine import Engine  # noqa: E402
from avkit.runtime.request import Request  # noqa: E402
from avkit.runtime.trace_rows import MemorySink  # noqa: E402
from avkit.scheduling.adaptive import make_adaptive  # noqa: E402
from avkit.scheduling.cost import CostTable  # noqa: E402
from avkit.scheduling.profile import PRICE_GRID, memory_meta, profile_costs  # noqa: E402
from avkit.scheduling.roofline import MODELS, Accelerator, forward_ms  # noqa: E402
from avkit.staged import staged_file  # noqa: E402

WHEELS = ("polars-1.33.1-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",)  # 37.9 MiB, in .whl/
STEPS = ("pytest", "kernels", "engine", "profile", "sim")


@dataclass(frozen=True)
class Sizes:
    """Everything the dry run shrinks; the code paths stay the same."""

    budget_s: dict  # step -> seconds
    batches: tuple[int, ...]  # kernels: B
    vocab: int  # kernels: V
    matmul_n: int  # kernels: n of the n x n x n product timed for the roofline
    engine_vocab: int  # engine: the tiny models' vocabulary
    chi2_requests: int  # engine: seeded requests per engine in the T = 1 test
    shapes: tuple[str, ...]  # profile: keys of SHAPES, each (target, draft)
    context: int  # profile: synthetic KV context per request (the greedy trace's mean is 377 tokens)
    max_concurrency: int  # profile: largest batch profiled (less where the device's memory says so)
    repeats: int  # profile: timed runs per point
    tune_traces: tuple[str, ...]  # sim: what `avkit tune` simulates
    tune_concurrency: tuple[int, ...]  # sim: concurrencies simulated (cut at what was profiled)
    bootstrap: int  # sim: tune's bootstrap resamples
    hvd_traces: tuple[str, ...]  # sim: what `avkit hvd` replays
    hvd_epochs: int  # sim: payoff MLP epochs


REAL = Sizes(budget_s={"pytest": 75, "kernels": 90, "engine": 60, "profile": 60, "sim": 165},
             batches=(1, 64, 256), vocab=151_936, matmul_n=8192, engine_vocab=300, chi2_requests=4000,
             shapes=("pair", "8b"), context=512, max_concurrency=1024, repeats=5,
             tune_traces=("traces/greedy_k7.parquet",), tune_concurrency=(1, 4, 16, 64, 256, 1024), bootstrap=100,
             hvd_traces=("traces/greedy_k7.parquet", "traces/reuse/t0_bfcl_multiturn_k7.parquet",
                         "traces/reuse/t0_edit_k7.parquet", "traces/reuse/t0_mtbench_revise_k7.parquet",
                         "traces/reuse/t0_sharegpt_multiround_k7.parquet"), hvd_epochs=30)
DRY = Sizes(budget_s={"pytest": 60, "kernels": 60, "engine": 60, "profile": 60, "sim": 90},
            batches=(1, 3), vocab=1000, matmul_n=128, engine_vocab=300, chi2_requests=400,
            shapes=("tiny",), context=16, max_concurrency=4, repeats=1,
            tune_traces=("traces/reuse/t0_bfcl_multiturn_k7.parquet",), tune_concurrency=(1, 4), bootstrap=10,
            hvd_traces=("traces/reuse/t0_bfcl_multiturn_k7.parquet",), hvd_epochs=1)


class StepTimeout(BaseException):
    """Raised by the step's alarm; a BaseException so that no `except Exception` inside avkit swallows it."""


class Results:
    """One results directory: summary.json, step files, and the optional bundle, written as the run goes."""

    def __init__(self, out: Path, bundle: Path | None, meta: dict):
        self.out, self.bundle = out, bundle
        out.mkdir(parents=True, exist_ok=True)
        old = out / "summary.json"  # a rerun of some steps keeps the other steps' entries
        self.summary = json.loads(old.read_text()) if old.is_file() else {"steps": {}}
        self.summary.update(meta)

    def write_json(self, name: str, obj) -> Path:
        with staged_file(self.out / name) as tmp:
            tmp.write_text(json.dumps(obj, indent=1, default=str))
        return self.out / name

    def step(self, name: str, entry: dict) -> None:
        self.summary["steps"][name] = entry
        self.write_json("summary.json", self.summary)

    def pack(self) -> None:
        if self.bundle is None:
            return
        with staged_file(self.bundle) as tmp, tarfile.open(tmp, "w:gz") as tar:  # no staged temps inside
            tar.add(self.out, arcname=self.out.name, filter=lambda t: None if t.name.endswith(".tmp") else t)


@dataclass
class Context:
    """What a step sees."""

    sizes: Sizes
    results: Results
    device: object  # torch.device
    env: dict  # for child processes: PYTHONPATH with the tree first

    def run(self, name: str, cmd: list[str], timeout: float) -> dict:
        """A child process, its output into <name>.log; -> {cmd, rc (None: killed at `timeout` s), seconds}."""
        t0 = time.perf_counter()
        with open(self.results.out / f"{name}.log", "w") as log:
            try:
                rc = subprocess.run(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=max(timeout, 1)).returncode
            except subprocess.TimeoutExpired:
                rc = None
        return {"cmd": " ".join(cmd), "rc": rc, "seconds": round(time.perf_counter() - t0, 1)}


K = 7  # draft length
# ---- kernels step ----------------------------------------------------------------------------------
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
    ms = bench_ms(lambda: y.copy_(x), device)
    info["copy_tb_s"] = 2 * x.numel() * 4 / (ms * 1e-3) / 1e12
    return info


def matmul_tflops(device: torch.device, n: int) -> float:
    """Dense matmul rate of an n x n x n product (bf16 on CUDA, fp32 elsewhere), TFLOP/s."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n ** 3 / (bench_ms(lambda: a @ b, device) * 1e-3) / 1e12


def confidence_case(kernels, refs, B, V, dtype, g):
    x = (torch.randn(B, K, V, device=g.device, generator=g) * 3).to(dtype)  # [B, K, V] draft logits
    args = (x, torch.rand(B, device=g.device, generator=g) + 0.5, torch.arange(K, device=g.device), 0.5,
            torch.linspace(-1, 0.5, K, device=g.device))
    got, want = kernels.confidence(*args), refs.confidence(*args)
    err = {n: float((getattr(got, n) - getattr(want, n)).abs().max()) for n in got._fields}
    ok = all(err[n] <= ATOL[n] for n in err)
    nbytes = x.numel() * x.element_size()  # the logits, read once
    return ok, err, (lambda: kernels.confidence(*args)), (lambda: refs.confidence(*args)), nbytes


def rejection_case(kernels, refs, B, V, greedy, g):
    lt = torch.randn(B, K + 1, V, device=g.device, generator=g) * 2
    tp = lt.softmax(-1)  # [B, K+1, V]
    dp = (lt[:, :K] + torch.randn(B, K, V, device=g.device, generator=g)).softmax(-1)  # [B, K, V]
    x = torch.multinomial(dp.reshape(-1, V), 1, generator=g).reshape(B, K)
    if greedy:
        x = torch.where(torch.rand(B, K, device=g.device, generator=g) < 0.8, tp[:, :K].argmax(-1), x)
    args = (tp, dp, x, torch.randint(0, K + 1, (B,), device=g.device, generator=g))
    kw = {"greedy": greedy, "seeds": torch.randint(0, 2**40, (B,), device=g.device, generator=g),
          "request_keys": torch.arange(B, device=g.device),
          "positions": torch.zeros(B, dtype=torch.int64, device=g.device)}
    got, want = kernels.rejection_sample(*args, **kw), refs.rejection_sample(*args, **kw)
    bad_rows = int((got.output_tokens != want.output_tokens).any(1).sum())
    ok = bad_rows == 0 and torch.equal(got.num_accepted, want.num_accepted)
    ok = ok and torch.equal(got.observed, want.observed) and torch.equal(got.accepted, want.accepted)
    n = want.num_accepted
    rows_read = (n + 1).sum() if greedy else B + (n < args[3]).sum()  # greedy: rows 0..k; else p_n (+ q_n)
    nbytes = int(rows_read) * V * 4
    return ok, {"rows_differing": bad_rows}, (lambda: kernels.rejection_sample(*args, **kw)), \
        (lambda: refs.rejection_sample(*args, **kw)), nbytes


def irls_case(kernels, refs, B, V, g):
    n = B * K  # one engine step of slots
    f = torch.randn(n, device=g.device, generator=g) * 3
    pos = torch.arange(n, device=g.device) % K
    p = torch.sigmoid(0.5 * f - 0.2)
    y = (torch.rand(n, device=g.device, generator=g) < p).float()
    obs = torch.rand(n, device=g.device, generator=g) < 0.7
    args = (f, pos, p, y, obs, K)
    got, want = kernels.irls_stats(*args), refs.irls_stats(*args)
    err = max(float(((getattr(got, s) - getattr(want, s)).abs() / (getattr(want, s).abs() + 1e-4)).max())
              for s in ("a", "b", "c", "g0", "g1"))
    ok = err < 1e-4 and torch.equal(got.n, want.n)
    nbytes = n * 21  # fp32 f, p, y + int64 position + bool observed
    tri, ref = (lambda: kernels.irls_stats(*args)), (lambda: refs.irls_stats(*args))
    return ok, {"max_rel_err": err}, tri, ref, nbytes


def allocation_case(kernels, refs, B, V, g):
    c = torch.randint(0, 9, (B, K), device=g.device, generator=g).float() / 8  # ties on purpose
    nd = torch.randint(0, K + 1, (B,), device=g.device, generator=g)
    budget = torch.tensor([max(B * K // 3, 1)], device=g.device)
    got, want = kernels.allocate(c, nd, budget), refs.allocate(c, nd, budget)
    ok = torch.equal(got.num_verify, want.num_verify) and torch.equal(got.survival, want.survival)
    nbytes = B * K * 12  # confidences in, survival out, survival re-read
    return ok, {}, (lambda: kernels.allocate(c, nd, budget)), (lambda: refs.allocate(c, nd, budget)), nbytes


CASES = [("confidence fp32", confidence_case, (torch.float32,)),
         ("confidence bf16", confidence_case, (torch.bfloat16,)),
         ("rejection", rejection_case, (False,)),
         ("rejection greedy", rejection_case, (True,)),
         ("irls_stats", irls_case, ()),
         ("allocation", allocation_case, ())]


def run_all(device: torch.device, batches, V: int, peak_tb_s: float | None, on_case) -> list[dict]:
    """Check every kernel against its reference at each batch size and time both; `on_case(rows so far)` after
    each row (the check writes partial results through it)."""
    kernels, refs = select_kernels(device, backend="triton"), select_kernels(device, backend="torch")
    g = torch.Generator(device=device).manual_seed(0)
    cases = []
    for B in batches:
        for name, case, extra in CASES:
            ok, detail, tri, ref, nbytes = case(kernels, refs, B, V, *extra, g)
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


# ---- engine and profile steps: random-weight models built on the device ----------------------------
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


def run_checks(device, vocab: int, n_chi2: int, on_check) -> dict:
    """Every engine check, each guarded; `on_check(checks so far)` after each."""
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
        on_check(checks)
    return checks


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


def step_pytest(ctx: Context, limit: float) -> dict:
    """Every test that carries the `gpu` marker (they skip without CUDA: the dry run checks the command)."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if "mark.gpu" in p.read_text(encoding="utf-8"))
    xml = ctx.results.out / "pytest_gpu.xml"
    xml.unlink(missing_ok=True)  # a rerun into the same directory must not read the last run's
    res = ctx.run("pytest", [sys.executable, "-m", "pytest", "-m", "gpu and not slow", "-p", "no:cacheprovider",
                             "-q", f"--junitxml={xml}", *files], limit - 5)
    if not xml.is_file():
        return {**res, "files": files, "ok": False, "error": "no junit XML (killed at its limit?): see pytest.log"}
    suite = ElementTree.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return {**res, "files": files, **counts, "ok": res["rc"] == 0 and not counts["failures"] + counts["errors"]}


def step_kernels(ctx: Context, limit: float) -> dict:
    s, dev = ctx.sizes, ctx.device
    bw = device_bandwidth(dev)
    tflops = matmul_tflops(dev, s.matmul_n)
    cases = run_all(dev, s.batches, s.vocab, bw["peak_tb_s"], lambda rows: ctx.results.write_json(
        "kernels.json", {"bandwidth": bw, "matmul_tflops": tflops, "cases": rows}))
    hot = hot_path(cases, max(s.batches), bw["copy_tb_s"], tflops)
    sweep = sweep_confidence(dev, max(s.batches), s.vocab, bw["peak_tb_s"])
    ctx.results.write_json("kernels.json", {"bandwidth": bw, "matmul_tflops": tflops, "cases": cases,
                                            "hot_path": hot, "confidence_sweep": sweep})
    conf = next(c for c in cases if c["kernel"] == "confidence bf16" and c["B"] == max(s.batches))
    return {"ok": all(c["correct"] for c in cases), "wrong": [(c["kernel"], c["B"]) for c in cases if not c["correct"]],
            "peak_tb_s": bw["peak_tb_s"], "peak_source": bw["source"], "copy_tb_s": bw["copy_tb_s"],
            "matmul_tflops": tflops, "confidence_bf16_pct_peak": conf["pct_peak"], "hot_path": hot}


def step_engine(ctx: Context, limit: float) -> dict:
    checks = run_checks(ctx.device, ctx.sizes.engine_vocab, ctx.sizes.chi2_requests,
                                   on_check=lambda c: ctx.results.write_json("engine.json", c))
    return {"ok": all(c["ok"] for c in checks.values()), **{k: c["ok"] for k, c in checks.items()}}


def step_profile(ctx: Context, limit: float) -> dict:
    out = {}
    for name in ctx.sizes.shapes:
        out[name] = profile_shape(name, ctx.device, ctx.sizes, ctx.results.out / f"cost_{name}.json")
        ctx.results.write_json("profile.json", out)
    return {"ok": True, **out}


def step_sim(ctx: Context, limit: float) -> dict:
    """`avkit hvd` with the pair's table (the traces are the pair's), then `avkit tune` per measured table."""
    deadline = time.monotonic() + limit
    s, out, res = ctx.sizes, ctx.results.out, {}
    tables = {n: out / f"cost_{n}.json" for n in s.shapes if (out / f"cost_{n}.json").is_file()}
    if not tables:
        raise RuntimeError(f"no cost_*.json in {out}: run the profile step first")
    hvd_table = tables.get("pair", tables.get("tiny"))
    if hvd_table is not None:  # the decision HVD waits on first (the traces were recorded by this pair); it
        # leaves `avkit tune` a minute at least
        res["hvd"] = ctx.run("hvd", [sys.executable, "-m", "avkit", "hvd", *s.hvd_traces, "--cost-table",
                                     str(hvd_table), "--out", str(out / "hvd"), "--markdown", str(out / "hvd.md"),
                                     "--epochs", str(s.hvd_epochs)], max(limit / 2, deadline - time.monotonic() - 60))
        res["hvd"].update(hvd_headline(out / "hvd" / "hvd_metrics.json") if res["hvd"]["rc"] == 0 else {})
    for name, path in tables.items():
        profiled = json.loads(path.read_text())["draft_requests"][-1]
        conc = ",".join(str(c) for c in s.tune_concurrency if c <= profiled)
        res[f"tune_{name}"] = ctx.run(f"tune_{name}", [
            sys.executable, "-m", "avkit", "tune", *s.tune_traces, "--cost", str(path), "--concurrency", conc,
            "--bootstrap", str(s.bootstrap), "--out", str(out / f"tune_{name}.json")], deadline - time.monotonic())
        res[f"tune_{name}"].update(tune_headline(out / f"tune_{name}.json") if res[f"tune_{name}"]["rc"] == 0 else {})
    return {"ok": all(r["rc"] == 0 for r in res.values()), **res}


def tune_headline(path: Path) -> dict:
    """Per concurrency: the best fixed K, the best adaptive arm and their ratio; what tune recommends."""
    r = json.loads(path.read_text())
    rows = []
    for c in r["concurrency"]:
        cells = [x for x in r["cells"] if x["concurrency"] == c]
        fixed = max((x for x in cells if x["kind"] == "fixed"), key=lambda x: x["throughput_tok_s"])
        adaptive = max((x for x in cells if x["kind"].startswith("adaptive")), key=lambda x: x["throughput_tok_s"])
        nospec = next(x for x in cells if x["kind"] == "nospec")
        rows.append({"c": c, "best_fixed": fixed["arm"], "fixed_tok_s": round(fixed["throughput_tok_s"], 1),
                     "best_adaptive": adaptive["arm"], "adaptive_vs_fixed": round(adaptive["throughput_tok_s"]
                                                                                 / fixed["throughput_tok_s"], 4),
                     "nospec_tok_s": round(nospec["throughput_tok_s"], 1)})
    return {"per_concurrency": rows, "infeasible": [x["concurrency"] for x in r["infeasible"]],
            "kv_max_concurrency": r["memory"].get("max_concurrency"),
            "ranges": r["schedule"]["ranges"], "adaptive_on": r["schedule"]["adaptive"]}


def hvd_headline(path: Path) -> dict:
    """Per dataset: best single drafter, best router and its ratio, the clairvoyant bound (headroom)."""
    return {"per_dataset": [{k: v[k] for k in ("dataset", "best_single_router", "best_router", "ratio", "oracle",
                                               "headroom")} for v in json.loads(path.read_text())["verdict"]]}


RUNNERS = {"pytest": step_pytest, "kernels": step_kernels, "engine": step_engine, "profile": step_profile,
           "sim": step_sim}


def _alarm(signum, frame):
    raise StepTimeout


def run_steps(ctx: Context, names: list[str], budget_s: float) -> bool:
    """Each step under its limit (its budget plus what earlier steps left, never past the whole budget)."""
    t_end, spare = time.monotonic() + budget_s, 0.0
    signal.signal(signal.SIGALRM, _alarm)
    for name in names:
        limit = min(ctx.sizes.budget_s[name] + spare, t_end - time.monotonic())
        if limit < 2:
            ctx.results.step(name, {"ok": False, "error": "skipped: the run's time budget is spent"})
            continue
        print(f"gpu_check: {name} (limit {limit:.0f} s)", file=sys.stderr, flush=True)
        ctx.results.step(name, {"ok": False, "error": "running (no result yet: cut short?)"})
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            entry = RUNNERS[name](ctx, limit)
        except StepTimeout:
            entry = {"ok": False, "error": f"timed out after {limit:.0f} s"}
        except Exception as e:  # guarded: record and go on
            entry = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        if getattr(ctx.device, "type", "") == "cuda":  # what a failed or cut step held goes back before the next
            gc.collect()
            torch.cuda.empty_cache()
        spare = max(limit - entry["seconds"], 0.0)
        ctx.results.step(name, entry)
        ctx.results.pack()
        print(f"gpu_check: {name} {'ok' if entry.get('ok') else 'FAILED'} in {entry['seconds']} s"
              + ("" if entry.get("ok") else f": {entry.get('error', 'see the step file')}"), file=sys.stderr, flush=True)
    return all(ctx.results.summary["steps"][n].get("ok") for n in names)


def package_versions() -> dict:
    """The versions the run met (the device's own, or a carried wheel's); "missing" where not installed."""
    out = {}
    for name in ("numpy", "polars", "pyarrow", "scipy", "transformers", "tokenizers", "typer", "rich", "pytest",
                 "nvidia-ml-py", "cupy-cuda13x"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="this CPU, tiny sizes, Triton's interpreter")
    ap.add_argument("--out", default="", help="results directory (default bench/results/gpu/<date>-<gpu>; "
                                              "dry run: a new temporary directory)")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    ap.add_argument("--budget-s", type=float, default=450.0, help="the whole run's time limit, seconds")
    ap.add_argument("--bundle", default="", help="also pack the results directory into this .tar.gz after every step")
    a = ap.parse_args(argv)
    names = [s.strip() for s in a.steps.split(",") if s.strip()]
    if bad := [n for n in names if n not in STEPS]:
        ap.error(f"--steps: unknown step {bad[0]!r} (steps: {', '.join(STEPS)})")
    if not a.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if a.dry_run else "cuda")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu-dry-run"
    if a.out:
        out = Path(a.out)
    elif a.dry_run:
        out = Path(tempfile.mkdtemp(prefix="gpu_check_dry_"))
    else:
        out = ROOT / "bench" / "results" / "gpu" / f"{time.strftime('%Y-%m-%d')}-{re.sub('[^a-z0-9]+', '-', gpu.lower()).strip('-')}"
    meta = {"device": gpu, "dry_run": a.dry_run, "python": sys.version.split()[0], "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": " ".join([Path(sys.executable).name, *sys.argv]), "wheels": list(WHEELS),
            "packages": package_versions()}
    sizes = DRY if a.dry_run else REAL
    results = Results(out, Path(a.bundle) if a.bundle else None, {**meta, "sizes": asdict(sizes)})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    ok = run_steps(Context(sizes, results, device, env), names, a.budget_s)
    brief = {n: {k: v for k, v in e.items() if k != "traceback"} for n, e in results.summary["steps"].items()}
    print(json.dumps(brief, indent=1, default=str))  # the headline numbers, last in the output
    print(f"gpu_check: {'all steps ok' if ok else 'some steps FAILED'}; results in {out}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
