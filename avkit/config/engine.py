"""The engine, the models it runs and how one request samples: what `record` and `serve` (and tests,
benches) compose."""

from __future__ import annotations

from dataclasses import dataclass

from avkit.config.fields import DEFAULT_DRAFT, DEFAULT_K, DEFAULT_TARGET, MAX_K, Checked, checked
from avkit.validate import check_placement, in_range

DRAFTERS = ("model", "hybrid")
RUN_ENGINES = ("native", "vllm")  # `--engine` of record and profile: avkit's runtime | vLLM's offline engine
KERNEL_BACKENDS = ("auto", "torch", "triton")  # avkit/kernels/dispatch.py select_kernels


@dataclass(frozen=True)
class EngineConfig(Checked):
    """The speculative decoding engine: K drafts per request and step, batch and context limits.

    k = 0 (or no drafter) is target-only decoding. `seed` is used for requests whose
    SamplingConfig has no seed of its own.
    """

    k: int = checked(DEFAULT_K, 0, MAX_K)  # draft tokens proposed per request and step
    concurrency: int = checked(8, 1)  # requests decoding at once (KV-cache slots)
    max_len: int = 2048  # tokens per sequence: prompt + output (+ K draft slots in flight)
    seed: int = 0
    # hot-path kernels (avkit/kernels/dispatch.py): auto = Triton on CUDA, the torch references on CPU;
    # triton on a CPU runs Triton's interpreter (TRITON_INTERPRET=1 set before triton is imported)
    kernels: str = checked("auto", choices=KERNEL_BACKENDS)

    def __post_init__(self):
        super().__post_init__()
        in_range(self, "max_len", self.k + 2)


@dataclass(frozen=True)
class ModelsConfig(Checked):
    """The target/draft pair, the drafter in front of the draft model, and where they run."""

    target: str = DEFAULT_TARGET  # alias, HF directory or GGUF file
    draft: str = DEFAULT_DRAFT  # "" or "none": target-only decoding
    # model: the draft model; hybrid: suffix cache or draft model per step (HVD)
    drafter: str = checked("model", choices=DRAFTERS)
    payoff: str = ""  # hybrid, from `avkit hvd`: payoff_mlp.pt (tau) or payoff_survival.pt (joint budget)
    device: str = "auto"  # auto (a GPU if torch sees one) | cpu | cuda[:N]
    dtype: str = "auto"  # auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 (~3x on AVX512-BF16)

    def __post_init__(self):
        super().__post_init__()
        check_placement(self.device, self.dtype)

    @property
    def has_draft(self) -> bool:
        return self.draft not in ("", "none")


@dataclass(frozen=True)
class SamplingConfig(Checked):
    """How one request samples (its own settings; the engine applies them per row): temperature 0 means
    greedy; top_k 0 and min_p 0 are off."""

    temperature: float = checked(1.0, 0.0)
    top_p: float = checked(0.95, 0.0, 1.0, lo_open=True)
    max_new_tokens: int = checked(256, 1)
    seed: int | None = None
    top_k: int = checked(0, 0)  # keep the k most probable tokens (ties at the k-th kept)
    min_p: float = checked(0.0, 0.0, 1.0)  # keep tokens with probability >= min_p * the most probable one's


__all__ = ["DRAFTERS", "KERNEL_BACKENDS", "RUN_ENGINES", "EngineConfig", "ModelsConfig", "SamplingConfig"]
