"""Step costs, trace replay and tuning: `avkit profile`, `avkit simulate`, `avkit tune`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from avkit.config.engine import ENGINE_HELP, RUN_ENGINES, VLLM_PYTHON_HELP, ModelsConfig, SamplingConfig
from avkit.config.fields import DEFAULT_K, MAX_K, SHIPPED_COST, Checked, checked
from avkit.errors import ConfigError
from avkit.validate import shown

# the shipped cost table profiles draft batches of 1-16 requests (the traces were recorded at 8)
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
DEFAULT_COST_PATH = "~/.cache/avkit/cost.json"  # where `avkit profile` writes by default
PROFILE_CONTEXT_ENV = "AVKIT_PROFILE_CONTEXT_LEN"  # overrides ProfileConfig.context_len


def default_cost_spec() -> str:
    """The cost model an engine prices its steps with when --cost is not given (record, serve, the adaptive
    policy): the table `avkit profile` wrote on this machine if there is one, else the CPU roofline."""
    profiled = Path(DEFAULT_COST_PATH).expanduser()
    return str(profiled) if profiled.is_file() else "roofline:cpu:1.5b"


@dataclass(frozen=True)
class ProfileConfig(Checked):
    """`avkit profile`: step costs of this device at a synthetic KV context."""

    models: ModelsConfig = field(default_factory=ModelsConfig)  # target, draft ("none": verify costs only),
    # device, dtype: profile what you record or serve with
    out: str = checked(DEFAULT_COST_PATH, help="cost table JSON (the adaptive policy's default path)")
    engine: str = checked("native", choices=RUN_ENGINES, help=ENGINE_HELP)
    vllm_python: str = checked("", help=VLLM_PYTHON_HELP)
    threads: int = checked(0, 0, help="--engine vllm: CPU cores vLLM binds (0 = all)")
    context_len: int = checked(8192, 0, help=f"synthetic KV context per request ({PROFILE_CONTEXT_ENV} overrides)")
    # verify layout: T target tokens = ceil(T / (k + 1)) requests of <= k + 1 tokens
    k: int = checked(DEFAULT_K, 0, MAX_K, help="draft tokens per request (verify layout)", flags=("-k", "--k"))
    max_verify_tokens: int = checked(64, 1, help="largest verify step, target tokens")
    max_requests: int = checked(8, 1, help="largest draft batch, requests")
    repeats: int = checked(5, 1, help="timed runs per point (median kept)")
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

    concurrency: tuple[int, ...] = checked(DEFAULT_CONCURRENCY, help="comma-separated concurrencies (batch sizes)")
    # a cost table JSON, or a what-if roofline:GPU:TARGET[:DRAFT][:context=N,drafter=...][:key=value,...]
    cost: str = checked(SHIPPED_COST, help=(
        "a cost file (`avkit profile`, or the model `avkit serve` learned: learned_cost.json; default: the shipped "
        "traces' model pair profiled on a 2-core CPU), or a roofline what-if: roofline:GPU:TARGET, optionally "
        "followed by :DRAFT and :context=N,drafter=parallel"))
    waves: int = checked(4, 1, help="requests served per lane at least (recorded ones are cycled)")

    def __post_init__(self):
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError(f"--concurrency must be integers >= 1, got {shown(self.concurrency)}")
        if len(set(self.concurrency)) != len(self.concurrency):
            raise ConfigError(f"--concurrency has a repeated value: {shown(self.concurrency)}")
        super().__post_init__()


@dataclass(frozen=True)
class SimulateConfig(ReplayConfig):
    """`avkit simulate`: trace replay of verify policies across concurrency (avkit/sim/replay.py)."""

    out: str = checked("reports/simulate.parquet", help="results Parquet (one row per concurrency x policy)")
    estimators: tuple[str, ...] = ("online_logistic", "qmax")  # adaptive runs, one per estimator
    oracle: bool = True  # adaptive with confidences that know the recorded outcomes
    burn_in: bool = True  # online estimators start from one pass over the traces (no coefficients file)
    coefficients: str = checked("", help="coefficients.json warm start for adaptive estimators")
    step_time: bool = checked(False, help="compare predicted with recorded step times", flags=("--step-time",))
    profile: str = checked("", help="replay an aggregate acceptance profile (`avkit import vllm-metrics`) instead "
                                    "of traces: nospec and fixed K only")

    def __post_init__(self):
        super().__post_init__()
        if self.step_time and self.profile:
            raise ConfigError("--step-time needs recorded step times: not with --profile")


TUNE_FORMATS = ("table", "json", "vllm", "vllm-context", "vllm-synthetic", "trtllm", "sglang")  # tune/formats.py: [2:]


@dataclass(frozen=True)
class TuneConfig(ReplayConfig):
    """`avkit tune`: which K at which batch size, and whether adaptive verification pays (avkit/tune/)."""

    # and adaptive's most drafts per step
    max_k: int = checked(0, 0, MAX_K, help="largest K tried (0: the traces' K)")
    tpot_slo_ms: float = checked(0.0, 0.0, help="p90 per-request ms per output token must stay under this (0: no SLO)")
    context: int = checked(0, 0, help="tokens per request for the KV-cache check (0: prompt + generated from the "
                                      "traces)")
    memory_gb: float = checked(0.0, 0.0, help="device memory, GB (0: from the cost table)")  # 1e9 bytes
    # share of device memory the engine may fill (vLLM gpu_memory_utilization)
    memory_utilization: float = checked(0.9, 0.0, 1.0, lo_open=True)
    estimator: str = checked("online_logistic", help="adaptive verification's estimator")
    draft_gate: bool | None = checked(None, help="simulate adaptive with avkit's draft gate (default: on, off for "
                                                 "--format vllm: vLLM has none)", show_default=False)
    bootstrap: int = checked(1000, 10, help="bootstrap resamples of the recorded requests")
    level: float = checked(0.9, 0.0, 1.0, lo_open=True, hi_open=True)  # two-sided interval level
    seed: int = checked(0, help="bootstrap seed")
    format: str = checked("table", choices=TUNE_FORMATS, help=(
        "stdout: table | json (everything) | vllm (exactly the --speculative-config JSON) | vllm-context (5-item, "
        "vLLM PR #48944's format) | vllm-synthetic | trtllm | sglang (its --speculative-adaptive-config file)"))
    out: str = checked("reports/tune.json", help="the whole result as JSON (read by `avkit report`)")
    datasets: tuple[str, ...] = checked((), help="comma-separated: tune on these datasets' requests only, the "
                                                 "traffic the engine will serve (default: every request)")
    # avkit/tune/prefill.py
    max_new_tokens: int = checked(0, 0, help="the engine's cap on new tokens per request: the traces' requests are "
                                             "cut there (0: as recorded)")
    # `model` in vLLM's speculative_config
    draft: str = checked("", help="the draft model vLLM loads (its HF directory; default: the traces' draft id)")
    # avkit/tune/context.py
    context_bands: tuple[int, ...] = checked((), help=(
        "comma-separated upper bounds of context-length bands, each tuned apart (e.g. 2047,8191,32767; a roofline "
        "cost or a table with kv_ms_per_token)"))

    def __post_init__(self):
        super().__post_init__()
        if self.draft_gate is None:
            object.__setattr__(self, "draft_gate", self.format != "vllm")
        if not str(self.out).endswith(".json"):
            raise ConfigError(f"--out must be a .json path, got {shown(self.out)}")
        if any(not d for d in self.datasets) or len(set(self.datasets)) != len(self.datasets):
            raise ConfigError(f"--datasets must be distinct non-empty names, got {shown(self.datasets)}")
