"""Every Triton kernel compiles to a cubin for an H200 (sm_90) — on a machine without a GPU.

The interpreter runs the kernels' semantics on CPU but never compiles them; this test runs
`triton.compile` (ptxas ships with triton) in a child process, because this pytest process may have
imported triton under TRITON_INTERPRET=1. Signatures name the dtypes the launchers pass.
"""

import os
import subprocess
import sys

import pytest

TARGET = ("cuda", 90, 32)  # backend, compute capability (H100/H200), warp size
SIGNATURES = {
    "avkit.kernels.confidence:confidence_kernel": (
        ("logits_ptr=*bf16 stride_row=i64 inv_temp_ptr=*fp32 pos_ptr=*i64 intercept_ptr=*fp32 slope_ptr=*fp32 "
         "logit_ptr=*fp32 qmax_ptr=*fp32 q2nd_ptr=*fp32 entropy_ptr=*fp32 conf_ptr=*fp32 margin_ptr=*fp32 "
         "nnlq_ptr=*fp32 V=i32"),
        {"BLOCK_V": 4096}),
    "avkit.kernels.rejection:rejection_kernel": (
        ("target_ptr=*fp32 stride_tb=i64 stride_tk=i64 draft_ptr=*fp32 stride_db=i64 stride_dk=i64 "
         "tokens_ptr=*i64 stride_xb=i32 num_verify_ptr=*i64 seeds_ptr=*i64 keys_ptr=*i64 pos_ptr=*i64 "
         "out_ptr=*i64 num_acc_ptr=*i64 accepted_ptr=*i1 target_prob_ptr=*fp32 K=i32 V=i32"),
        {"GREEDY": False, "K_PAD": 8, "BLOCK_V": 2048, "LIBDEVICE": True}),
    "avkit.kernels.irls_stats:irls_stats_kernel": (
        "f_ptr=*fp32 pos_ptr=*i64 p_ptr=*fp32 y_ptr=*fp32 obs_ptr=*i1 partial_ptr=*fp32 N=i32 K=i32",
        {"K_PAD": 8, "BLOCK": 1024}),
    "avkit.kernels.allocation:survival_kernel": (
        "c_ptr=*fp32 nd_ptr=*i64 s_ptr=*fp32 B=i32 K=i32", {"K_PAD": 8, "BLOCK_R": 128}),
    "avkit.kernels.allocation:allocation_kernel": (
        "s_ptr=*fp32 nd_ptr=*i64 budget_ptr=*i64 nv_ptr=*i64 B=i32 K=i32", {"K_PAD": 8, "BLOCK_S": 1024}),
}
VARIANTS = [(name, {}) for name in SIGNATURES] + [
    ("avkit.kernels.rejection:rejection_kernel", {"GREEDY": True}),
    ("avkit.kernels.confidence:confidence_kernel", {"logits_ptr": "*fp32"}),
]


def compile_all() -> list[str]:
    """Compile every variant for TARGET; return one line per failure."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    failures = []
    for name, override in VARIANTS:
        module, kernel = name.split(":")
        fn = getattr(importlib.import_module(module), kernel)
        text, constexprs = SIGNATURES[name]
        sig = dict(word.split("=") for word in text.split())
        constexprs = dict(constexprs)
        for key, value in override.items():
            (sig if key in sig else constexprs)[key] = value
        sig.update({key: "constexpr" for key in constexprs})
        try:
            triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                           target=GPUTarget(*TARGET), options={"num_warps": 8})
        except Exception as e:
            failures.append(f"{name} {override}: {type(e).__name__}: {str(e)[:2000]}")
    return failures


def test_kernels_compile_for_sm90():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silence triton 3.9's notice; its current default
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


if __name__ == "__main__":
    problems = compile_all()
    print("\n".join(problems) or f"compiled {len(VARIANTS)} kernels for {TARGET}")
    sys.exit(1 if problems else 0)
