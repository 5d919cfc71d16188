"""The engine, the models it runs, how one request samples, and the acceptance estimator and adaptive
verification it runs with (docs/estimator.md, docs/budget.md): what `record` and `serve` compose."""

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


@dataclass(frozen=True)
class EstimatorConfig(Checked):
    """Online acceptance estimator (docs/estimator.md): p_i = sigmoid(slope * f + intercept_i)."""

    feature: str = "logit_qmax"
    init_slope: float = 0.5
    init_intercept: float = -0.2
    refit_interval: int = checked(100, 1)  # engine steps per refit round
    ridge: float = checked(1e-3, 0.0)
    damping: float = checked(50.0, 0.0)  # update scaled by n / (n + damping)


@dataclass(frozen=True)
class ForgettingConfig(Checked):
    """`forgetting_logistic` (estimators/forgetting_logistic.py): the same model as EstimatorConfig's,
    refit from exponentially forgotten curvature, more often while young, faster after a shift."""

    half_life: float = checked(2000.0, 0.0, lo_open=True)  # engine steps after which past evidence weighs half
    young_interval: int = checked(5, 1)  # first round's engine steps; doubles every refit up to EstimatorConfig's
    shift_z: float = checked(4.0, 0.0, lo_open=True)  # |calibration z| of a round above this: a workload shift
    shift_keep: float = checked(0.2, 0.0, 1.0)  # share of past evidence kept after a shift
    # weight of the start coefficients, pseudo-slots/position
    prior_slots: float = checked(50.0, 0.0, lo_open=True)


@dataclass(frozen=True)
class AdaptiveConfig(Checked):
    """Budgeted verification (docs/budget.md): where the confidences and the step costs come from."""

    estimator: str = "online_logistic"  # a name in ESTIMATORS, or "none" (verify everything)
    coefficients: str = ""  # coefficients.json warm start for the estimator ("" = its defaults)
    # the suffix cache's rows (hybrid drafter): their own estimator, warm-started from a file fitted on
    # cache rows (`avkit fit --drafter suffix`; "" = the reference constants, refit from cache rows)
    cache_coefficients: str = ""
    cost: str = ""  # cost table JSON or roofline:GPU:MODEL ("" = DEFAULT_COST_PATH, else CPU roofline)
    history: int = checked(1000, 1)  # refits kept in the coefficient trajectory
    draft_gate: bool = True  # may skip drafting for a step when no draft depth pays at its load (gate.py)
    gate_window: int = checked(64, 1)  # recent drafted request-steps the gate replays its step on
    probe_every: int = checked(256, 1)  # skipped steps in a row before the gate drafts again to re-measure
    resume_margin: float = checked(0.1, 0.0)  # gate off: resume drafting only when it promises > 10% more tok/ms
    learn_cost: bool = False  # learn the cost model from the engine's step times (scheduling/learn.py; serve: on)
    # learning: every this many steps a probe verifies a depth set by the step count
    cost_probe_every: int = checked(97, 0)


__all__ = ["DRAFTERS", "KERNEL_BACKENDS", "RUN_ENGINES", "AdaptiveConfig", "EngineConfig", "EstimatorConfig",
           "ForgettingConfig", "ModelsConfig", "SamplingConfig"]
