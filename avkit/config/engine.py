"""The engine and the models it runs: what `record` and `serve` (and tests, benches) compose."""

from __future__ import annotations

from dataclasses import dataclass

from avkit.config.fields import DEFAULT_DRAFT, DEFAULT_K, DEFAULT_TARGET, MAX_K
from avkit.validate import check_placement, in_range, one_of

DRAFTERS = ("model", "hybrid")
RUN_ENGINES = ("native", "vllm")  # `--engine` of record and profile: avkit's runtime | vLLM's offline engine
KERNEL_BACKENDS = ("auto", "torch", "triton")  # avkit/kernels/dispatch.py BACKENDS


@dataclass(frozen=True)
class EngineConfig:
    """The speculative decoding engine: K drafts per request and step, batch and context limits.

    k = 0 (or no drafter) is target-only decoding. `seed` is used for requests whose
    SamplingConfig has no seed of its own.
    """

    k: int = DEFAULT_K  # draft tokens proposed per request and step
    concurrency: int = 8  # requests decoding at once (KV-cache slots)
    max_len: int = 2048  # tokens per sequence: prompt + output (+ K draft slots in flight)
    seed: int = 0
    # hot-path kernels (avkit/kernels/dispatch.py): auto = Triton on CUDA, the torch references on CPU;
    # triton on a CPU runs Triton's interpreter (TRITON_INTERPRET=1 set before triton is imported)
    kernels: str = "auto"

    def __post_init__(self):
        in_range(self, "k", 0, MAX_K)
        in_range(self, "concurrency", 1)
        in_range(self, "max_len", self.k + 2)
        one_of(self, "kernels", KERNEL_BACKENDS)


@dataclass(frozen=True)
class ModelsConfig:
    """The target/draft pair, the drafter in front of the draft model, and where they run."""

    target: str = DEFAULT_TARGET  # alias, HF directory or GGUF file
    draft: str = DEFAULT_DRAFT  # "" or "none": target-only decoding
    drafter: str = "model"  # model: the draft model; hybrid: suffix cache or draft model per step (HVD)
    payoff: str = ""  # hybrid, from `avkit hvd`: payoff_mlp.pt (tau) or payoff_survival.pt (joint budget)
    device: str = "auto"  # auto (a GPU if torch sees one) | cpu | cuda[:N]
    dtype: str = "auto"  # auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 (~3x on AVX512-BF16)

    def __post_init__(self):
        one_of(self, "drafter", DRAFTERS)
        check_placement(self.device, self.dtype)

    @property
    def has_draft(self) -> bool:
        return self.draft not in ("", "none")


__all__ = ["DRAFTERS", "KERNEL_BACKENDS", "RUN_ENGINES", "EngineConfig", "ModelsConfig"]
