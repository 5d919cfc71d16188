"""Step costs, trace replay and tuning: `avkit profile`, `avkit simulate`, `avkit tune`."""

from __future__ import annotations

from dataclasses import dataclass, field

from avkit.config.engine import RUN_ENGINES, ModelsConfig, SamplingConfig
from avkit.config.fields import DEFAULT_K, MAX_K, SHIPPED_COST, Checked, checked
from avkit.errors import ConfigError
from avkit.validate import shown

# the shipped cost table profiles draft batches of 1-16 requests (the traces were recorded at 8)
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
DEFAULT_COST_PATH = "~/.cache/avkit/cost.json"  # where `avkit profile` writes by default
PROFILE_CONTEXT_ENV = "AVKIT_PROFILE_CONTEXT_LEN"  # overrides ProfileConfig.context_len


@dataclass(frozen=True)
class ProfileConfig(Checked):
    """`avkit profile`: step costs of this device at a synthetic KV context."""

    models: ModelsConfig = field(default_factory=ModelsConfig)  # target, draft ("none": verify costs only),
    # device, dtype: profile what you record or serve with
    out: str = DEFAULT_COST_PATH  # the cost table JSON (the adaptive policy's default path)
    # native (avkit's runtime) | vllm (vLLM's offline engine in its own venv)
    engine: str = checked("native", choices=RUN_ENGINES)
    vllm_python: str = ""  # --engine vllm: that venv's python ("" = $AVKIT_VLLM_PYTHON, else .venv-vllm/bin/python)
    threads: int = checked(0, 0)  # --engine vllm: CPU cores vLLM binds (0 = all)
    # synthetic KV context per request (env AVKIT_PROFILE_CONTEXT_LEN overrides)
    context_len: int = checked(8192, 0)
    # verify layout: T target tokens = ceil(T / (k + 1)) requests of <= k + 1 tokens
    k: int = checked(DEFAULT_K, 0, MAX_K)
    max_verify_tokens: int = checked(64, 1)  # largest verify step profiled (target tokens)
    max_requests: int = checked(8, 1)  # largest draft batch profiled
    repeats: int = checked(5, 1)  # timed runs per point; the median is kept
    warmup: int = checked(1, 0)
    # temperature, top_p: the sampling work timed with every forward (the engine's logits work; 0 = argmax)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def __post_init__(self):
        super().__post_init__()
        if self.engine == "vllm" and self.k > 0 and not self.models.has_draft:
            raise ConfigError("--engine vllm with -k > 0 profiles the drafter too: give a --draft (or -k 0)")


@dataclass(frozen=True)
class ReplayConfig(Checked):
    """What `avkit simulate` and `avkit tune` share: the batch sizes replayed, the cost model, the length."""

    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    # cost table JSON, or a what-if roofline:GPU:TARGET[:DRAFT][:context=N,drafter=...][:key=value,...]
    cost: str = SHIPPED_COST
    waves: int = checked(4, 1)  # each lane serves >= this many requests (recorded requests are cycled)

    def __post_init__(self):
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError(f"--concurrency must be integers >= 1, got {shown(self.concurrency)}")
        if len(set(self.concurrency)) != len(self.concurrency):
            raise ConfigError(f"--concurrency has a repeated value: {shown(self.concurrency)}")
        super().__post_init__()


@dataclass(frozen=True)
class SimulateConfig(ReplayConfig):
    """`avkit simulate`: trace replay of verify policies across concurrency (avkit/sim/replay.py)."""

    out: str = "reports/simulate.parquet"
    estimators: tuple[str, ...] = ("online_logistic", "qmax")  # adaptive runs, one per estimator
    oracle: bool = True  # adaptive with confidences that know the recorded outcomes
    burn_in: bool = True  # online estimators start from one pass over the traces (no coefficients file)
    coefficients: str = ""  # coefficients.json warm start for adaptive estimators
    step_time: bool = False  # also compare predicted with recorded step times
    profile: str = ""  # replay an aggregate acceptance profile (`avkit import vllm-metrics`) instead of traces

    def __post_init__(self):
        super().__post_init__()
        if self.step_time and self.profile:
            raise ConfigError("--step-time needs recorded step times: not with --profile")


TUNE_FORMATS = ("table", "json", "vllm", "vllm-context", "vllm-synthetic", "trtllm", "sglang")  # tune/formats.py


@dataclass(frozen=True)
class TuneConfig(ReplayConfig):
    """`avkit tune`: which K at which batch size, and whether adaptive verification pays (avkit/tune/)."""

    # largest fixed K tried, and adaptive's most drafts per step (0 = the traces' K)
    max_k: int = checked(0, 0, MAX_K)
    tpot_slo_ms: float = checked(0.0, 0.0)  # p90 per-request ms per output token must stay <= this (0 = no SLO)
    # tokens per request for the KV-cache check (0 = mean prompt + generated in the traces)
    context: int = checked(0, 0)
    memory_gb: float = checked(0.0, 0.0)  # device memory in 1e9 bytes (0 = from the cost table's meta)
    # share of device memory the engine may fill (vLLM gpu_memory_utilization)
    memory_utilization: float = checked(0.9, 0.0, 1.0, lo_open=True)
    estimator: str = "online_logistic"  # adaptive verification's confidence source
    # adaptive arms may switch drafting off (avkit's engine; vLLM's AV has no gate): None = on, off for --format vllm
    draft_gate: bool | None = None
    bootstrap: int = checked(1000, 10)  # resamples of the recorded requests for the intervals
    level: float = checked(0.9, 0.0, 1.0, lo_open=True, hi_open=True)  # two-sided interval level
    seed: int = 0
    format: str = checked("table", choices=TUNE_FORMATS)
    out: str = "reports/tune.json"  # every result, for scripts and `avkit report`
    datasets: tuple[str, ...] = ()  # tune on these datasets' requests only (empty: every request in the traces)
    # requests as if capped at this many new tokens (0: as recorded; avkit/tune/prefill.py)
    max_new_tokens: int = checked(0, 0)
    draft: str = ""  # the draft model vLLM loads (`model` in its speculative_config; "": the traces' draft id)
    # upper bounds of context-length bands tuned apart (avkit/tune/context.py)
    context_bands: tuple[int, ...] = ()

    def __post_init__(self):
        super().__post_init__()
        if self.draft_gate is None:
            object.__setattr__(self, "draft_gate", self.format != "vllm")
        if not str(self.out).endswith(".json"):
            raise ConfigError(f"--out must be a .json path, got {shown(self.out)}")
        if any(not d for d in self.datasets) or len(set(self.datasets)) != len(self.datasets):
            raise ConfigError(f"--datasets must be distinct non-empty names, got {shown(self.datasets)}")
