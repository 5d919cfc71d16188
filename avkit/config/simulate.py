"""Step costs, trace replay and tuning: `avkit profile`, `avkit simulate`, `avkit tune`."""

from __future__ import annotations

from dataclasses import dataclass, field

from avkit.config.engine import RUN_ENGINES, ModelsConfig
from avkit.config.fields import DEFAULT_K, MAX_K
from avkit.config.sampling import SamplingConfig
from avkit.config.shipped import SHIPPED_COST
from avkit.errors import ConfigError
from avkit.validate import in_range, one_of, shown

# the shipped cost table profiles draft batches of 1-16 requests (the traces were recorded at 8)
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
DEFAULT_COST_PATH = "~/.cache/avkit/cost.json"  # where `avkit profile` writes by default
PROFILE_CONTEXT_ENV = "AVKIT_PROFILE_CONTEXT_LEN"  # overrides ProfileConfig.context_len


def check_concurrency(values: tuple[int, ...]) -> None:
    """--concurrency of simulate and tune: distinct batch sizes, each >= 1."""
    if not values or min(values) < 1:
        raise ConfigError(f"--concurrency must be integers >= 1, got {shown(values)}")
    if len(set(values)) != len(values):
        raise ConfigError(f"--concurrency has a repeated value: {shown(values)}")


@dataclass(frozen=True)
class ProfileConfig:
    """`avkit profile`: step costs of this device at a synthetic KV context."""

    models: ModelsConfig = field(default_factory=ModelsConfig)  # target, draft ("none": verify costs only),
    # device, dtype: profile what you record or serve with
    out: str = DEFAULT_COST_PATH  # the cost table JSON (the adaptive policy's default path)
    engine: str = "native"  # native (avkit's runtime) | vllm (vLLM's offline engine in its own venv)
    vllm_python: str = ""  # --engine vllm: that venv's python ("" = $AVKIT_VLLM_PYTHON, else .venv-vllm/bin/python)
    threads: int = 0  # --engine vllm: CPU cores vLLM binds (0 = all)
    context_len: int = 8192  # synthetic KV context per request (env AVKIT_PROFILE_CONTEXT_LEN overrides)
    k: int = DEFAULT_K  # verify layout: T target tokens = ceil(T / (k + 1)) requests of <= k + 1 tokens
    max_verify_tokens: int = 64  # largest verify step profiled (target tokens)
    max_requests: int = 8  # largest draft batch profiled
    repeats: int = 5  # timed runs per point; the median is kept
    warmup: int = 1
    # temperature, top_p: the sampling work timed with every forward (the engine's logits work; 0 = argmax)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def __post_init__(self):
        in_range(self, "context_len", 0)
        in_range(self, "k", 0, MAX_K)
        in_range(self, "max_verify_tokens", 1)
        in_range(self, "max_requests", 1)
        in_range(self, "repeats", 1)
        in_range(self, "warmup", 0)
        one_of(self, "engine", RUN_ENGINES)
        in_range(self, "threads", 0)
        if self.engine == "vllm" and self.k > 0 and not self.models.has_draft:
            raise ConfigError("--engine vllm with -k > 0 profiles the drafter too: give a --draft (or -k 0)")


@dataclass(frozen=True)
class SimulateConfig:
    """`avkit simulate`: trace replay of verify policies across concurrency (avkit/sim/replay.py)."""

    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    cost: str = SHIPPED_COST  # cost table JSON, or a what-if roofline:GPU:TARGET[:DRAFT][:context=N,drafter=...]
    out: str = "reports/simulate.parquet"
    waves: int = 4  # each lane serves >= this many requests (recorded requests are cycled)
    estimators: tuple[str, ...] = ("online_logistic", "qmax")  # adaptive runs, one per estimator
    oracle: bool = True  # adaptive with confidences that know the recorded outcomes
    burn_in: bool = True  # online estimators start from one pass over the traces (no coefficients file)

    def __post_init__(self):
        check_concurrency(self.concurrency)
        in_range(self, "waves", 1)


TUNE_FORMATS = ("table", "json", "vllm", "vllm-context", "vllm-synthetic", "trtllm", "sglang")  # tune/formats.py


@dataclass(frozen=True)
class TuneConfig:
    """`avkit tune`: which K at which batch size, and whether adaptive verification pays (avkit/tune/)."""

    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    cost: str = SHIPPED_COST  # cost table JSON, or a what-if roofline:GPU:TARGET[:DRAFT][:key=value,...]
    max_k: int = 0  # largest fixed K tried, and adaptive's most drafts per step (0 = the traces' K)
    tpot_slo_ms: float = 0.0  # p90 per-request ms per output token must stay <= this (0 = no SLO)
    context: int = 0  # tokens per request for the KV-cache check (0 = mean prompt + generated in the traces)
    memory_gb: float = 0.0  # device memory in 1e9 bytes (0 = from the cost table's meta)
    memory_utilization: float = 0.9  # share of device memory the engine may fill (vLLM gpu_memory_utilization)
    estimator: str = "online_logistic"  # adaptive verification's confidence source
    draft_gate: bool = True  # adaptive arms may switch drafting off (avkit's engine; vLLM's AV has no gate)
    waves: int = 4  # each lane serves >= this many requests (recorded requests are cycled)
    bootstrap: int = 1000  # resamples of the recorded requests for the intervals
    level: float = 0.9  # two-sided interval level
    seed: int = 0
    format: str = "table"
    out: str = "reports/tune.json"  # every result, for scripts and `avkit report`
    datasets: tuple[str, ...] = ()  # tune on these datasets' requests only (empty: every request in the traces)
    max_new_tokens: int = 0  # requests as if capped at this many new tokens (0: as recorded; avkit/tune/prefill.py)
    draft: str = ""  # the draft model vLLM loads (`model` in its speculative_config; "": the traces' draft id)
    context_bands: tuple[int, ...] = ()  # upper bounds of context-length bands tuned apart (avkit/tune/context.py)

    def __post_init__(self):
        check_concurrency(self.concurrency)
        in_range(self, "max_k", 0, MAX_K)
        in_range(self, "tpot_slo_ms", 0.0)
        in_range(self, "context", 0)
        in_range(self, "memory_gb", 0.0)
        in_range(self, "memory_utilization", 0.0, 1.0, lo_open=True)
        in_range(self, "waves", 1)
        in_range(self, "max_new_tokens", 0)
        in_range(self, "bootstrap", 10)
        in_range(self, "level", 0.0, 1.0, lo_open=True, hi_open=True)
        one_of(self, "format", TUNE_FORMATS)
        if not str(self.out).endswith(".json"):
            raise ConfigError(f"--out must be a .json path, got {shown(self.out)}")
        if any(not d for d in self.datasets) or len(set(self.datasets)) != len(self.datasets):
            raise ConfigError(f"--datasets must be distinct non-empty names, got {shown(self.datasets)}")


__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_COST_PATH", "PROFILE_CONTEXT_ENV", "TUNE_FORMATS", "ProfileConfig", "SimulateConfig", "TuneConfig"]
