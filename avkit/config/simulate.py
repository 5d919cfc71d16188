"""Step costs, trace replay and tuning: `avkit profile`, `avkit simulate`, `avkit tune`."""

from __future__ import annotations

from dataclasses import dataclass

from avkit.config.fields import DEFAULT_K, MAX_K
from avkit.config.shipped import SHIPPED_COST
from avkit.errors import ConfigError
from avkit.validate import check_choice, check_range

# the shipped cost table profiles draft batches of 1-16 requests (the traces were recorded at 8)
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
DEFAULT_COST_PATH = "~/.cache/avkit/cost.json"  # where `avkit profile` writes by default
PROFILE_CONTEXT_ENV = "AVKIT_PROFILE_CONTEXT_LEN"  # overrides ProfileConfig.context_len


@dataclass(frozen=True)
class ProfileConfig:
    """`avkit profile`: step costs of this device at a synthetic KV context."""

    context_len: int = 8192  # synthetic KV context per request (env AVKIT_PROFILE_CONTEXT_LEN overrides)
    k: int = DEFAULT_K  # verify layout: T target tokens = ceil(T / (k + 1)) requests of <= k + 1 tokens
    max_tokens: int = 64  # largest verify step profiled (target tokens)
    max_requests: int = 8  # largest draft batch profiled
    repeats: int = 5  # timed runs per point; the median is kept
    warmup: int = 1
    temperature: float = 1.0  # sampling work timed with every forward (the engine's logits work; 0 = argmax)
    top_p: float = 0.95

    def __post_init__(self):
        check_range("temperature", self.temperature, 0.0)
        check_range("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        check_range("context_len", self.context_len, 0)
        check_range("k", self.k, 0, MAX_K)
        check_range("max_tokens", self.max_tokens, 1)
        check_range("max_requests", self.max_requests, 1)
        check_range("repeats", self.repeats, 1)
        check_range("warmup", self.warmup, 0)


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
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError(f"concurrency must be positive integers, got {self.concurrency!r}")
        check_range("waves", self.waves, 1)


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
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError(f"--concurrency must be positive integers, got {self.concurrency!r}")
        if len(set(self.concurrency)) != len(self.concurrency):
            raise ConfigError(f"--concurrency has a repeated value: {self.concurrency!r}")
        check_range("--max-k", self.max_k, 0, MAX_K)
        check_range("--tpot-slo-ms", self.tpot_slo_ms, 0.0)
        check_range("--context", self.context, 0)
        check_range("--memory-gb", self.memory_gb, 0.0)
        check_range("--memory-utilization", self.memory_utilization, 0.0, 1.0, lo_open=True)
        check_range("--waves", self.waves, 1)
        check_range("--max-new-tokens", self.max_new_tokens, 0)
        check_range("--bootstrap", self.bootstrap, 10)
        check_range("--level", self.level, 0.0, 1.0, lo_open=True, hi_open=True)
        check_choice("--format", self.format, TUNE_FORMATS)
        if not str(self.out).endswith(".json"):
            raise ConfigError(f"--out must be a .json path, got {self.out!r}")
        if any(not d for d in self.datasets) or len(set(self.datasets)) != len(self.datasets):
            raise ConfigError(f"--datasets must be distinct non-empty names, got {','.join(self.datasets)!r}")


__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_COST_PATH", "PROFILE_CONTEXT_ENV", "TUNE_FORMATS", "ProfileConfig", "SimulateConfig", "TuneConfig"]
