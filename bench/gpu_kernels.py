"""GPU check of the Triton kernels: correctness at real sizes, then time per call vs the torch reference.

    python bench/gpu_kernels.py                  # H200: about 2-3 minutes, writes bench/results/

For B in {1, 64, 256}, K = 7, V = 151,936 (the Qwen2.5 vocabulary) it checks every kernel of
`avkit.kernels` against its reference on the GPU (integers bit-exact, floats within the test
tolerances), times both with `triton.testing.do_bench` (median ms per call), and reports the
bytes each kernel must move and the bandwidth it achieved against the H200's 4.3 TB/s. Last, it
puts the verification hot path at B = 256 (confidence + allocation + rejection sampling + IRLS
statistics, Triton) against the roofline time of an 8B target's verify step
(`avkit.scheduling.roofline`, 8192-token context). Goals (issue 6): confidence >= 60% of peak
bandwidth at B = 256 and the hot path < 5% of the verify step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

PEAK_TB_S = 4.3  # H200 memory bandwidth
K, V = 7, 151_936  # draft length, Qwen2.5 vocabulary
# every field of Confidence, the same tolerances as tests/test_kernels_confidence.py
ATOL = {"logit_qmax": 2e-5, "q_max": 1e-6, "q_2nd": 1e-6, "entropy": 1e-5, "confidence": 1e-6,
        "log_margin": 2e-5, "neg_log_neg_log_qmax": 5e-5}


def bench_ms(fn, device: torch.device) -> float:
    """Median ms per call: triton's do_bench on CUDA; a few timed calls elsewhere (dry runs)."""
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


def run_all(device: torch.device, batches, V: int, timed: bool = True):
    """Check every kernel against its reference at each batch size; time both when `timed`."""
    from avkit.kernels.dispatch import select_kernels

    kernels, refs = select_kernels(device, backend="triton"), select_kernels(device, backend="torch")
    g = torch.Generator(device=device).manual_seed(0)
    cases = []
    for B in batches:
        for name, case, extra in CASES:
            ok, detail, tri, ref, nbytes = case(kernels, refs, B, V, *extra, g)
            row = {"kernel": name, "B": B, "K": K, "V": V, "correct": bool(ok), "detail": detail}
            if timed:
                t_tri, t_ref = bench_ms(tri, device), bench_ms(ref, device)
                tb_s = nbytes / (t_tri * 1e-3) / 1e12
                row.update(triton_ms=t_tri, ref_ms=t_ref, speedup=t_ref / t_tri, bytes=nbytes, tb_s=tb_s,
                           pct_peak=100 * tb_s / PEAK_TB_S)
                print(f"{name:17s} B={B:3d} ok={ok!s:5s} triton {t_tri:8.4f} ms  ref {t_ref:8.4f} ms  "
                      f"{tb_s:6.3f} TB/s ({100 * tb_s / PEAK_TB_S:5.1f}% of peak)  {detail}", flush=True)
            cases.append(row)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return cases


def sweep_confidence(device: torch.device, B: int, V: int):
    """Launch configurations of the confidence kernel at batch B (to pick the launcher's defaults)."""
    from avkit.kernels.confidence import confidence_triton

    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        x = (torch.randn(B, K, V, device=device) * 3).to(dtype)
        args = (x, 1.0, torch.arange(K, device=device), 0.5, torch.zeros(K, device=device))
        for block_v in (2048, 4096, 8192):
            for warps in (4, 8, 16):
                def call(a=args, b=block_v, w=warps):
                    return confidence_triton(*a, block_v=b, num_warps=w)

                ms = bench_ms(call, device)
                tb_s = x.numel() * x.element_size() / (ms * 1e-3) / 1e12
                rows.append({"dtype": str(dtype), "block_v": block_v, "num_warps": warps, "ms": ms,
                             "pct_peak": 100 * tb_s / PEAK_TB_S})
                print(f"confidence {dtype} block_v={block_v} warps={warps}: {ms:.4f} ms "
                      f"({100 * tb_s / PEAK_TB_S:.1f}% of peak)", flush=True)
    return rows


def hot_path(cases, B: int):
    """The Triton hot path of one step at batch B vs an 8B target's roofline verify step on an H200."""
    from avkit.scheduling.roofline import ACCELERATORS, MODELS, forward_ms

    at = {c["kernel"]: c["triton_ms"] for c in cases if c["B"] == B}
    path = at["confidence bf16"] + at["allocation"] + at["rejection"] + at["irls_stats"]
    verify = float(forward_ms(MODELS["8b"], ACCELERATORS["h200"], B * (K + 1), B, 8192))
    return {"batch": B, "hot_path_ms": path, "verify_step_8b_ms": verify, "share_pct": 100 * path / verify}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None,
                    help="JSON path (default bench/results/gpu_kernels-<gpu>-<date>.json)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only for a dry run under TRITON_INTERPRET=1")
    ap.add_argument("--vocab", type=int, default=V, help="vocabulary size V")
    ap.add_argument("--batches", default="1,64,256", help="comma-separated batch sizes B")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device; nothing to do", file=sys.stderr)
        return 2
    batches = [int(b) for b in args.batches.split(",")]
    t0 = time.time()
    cases = run_all(device, batches, args.vocab)
    summary = hot_path(cases, max(batches))
    conf = next(c for c in cases if c["kernel"] == "confidence bf16" and c["B"] == max(batches))
    import triton

    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu-interpreter"
    summary.update(confidence_pct_peak=conf["pct_peak"], all_correct=all(c["correct"] for c in cases),
                   device=name, vocab=args.vocab, torch=torch.__version__, triton=triton.__version__,
                   wall_s=time.time() - t0)
    sweep = sweep_confidence(device, max(batches), args.vocab) if device.type == "cuda" else []
    print(json.dumps(summary, indent=2))
    tag = name.split()[-1].lower()
    out = Path(args.out or f"bench/results/gpu_kernels-{tag}-{time.strftime('%Y%m%d')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.partial")
    tmp.write_text(json.dumps({"summary": summary, "cases": cases, "confidence_sweep": sweep}, indent=2))
    os.replace(tmp, out)
    print(f"wrote {out}")
    return 0 if summary["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
