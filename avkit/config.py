"""Frozen configuration dataclasses, one per component; every default lives here once.

Each component receives the narrow config it uses. Validation happens in __post_init__ and
raises ConfigError naming the field and the bad value. The CLI builds its options from these
defaults (``default_of(Cls, "field")``), so the two never drift.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

from avkit.validate import check_choice, check_placement, check_range

# ---- shared constants (docs/estimator.md, reference values from vLLM's implementation) ----
DEFAULT_K = 7
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


def default_of(cls, name: str):
    """The dataclass default of one field (for building CLI options from config)."""
    for f in fields(cls):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:  # type: ignore[misc]
                return f.default_factory()  # type: ignore[misc]
    raise KeyError(name)


@dataclass(frozen=True)
class SamplingConfig:
    """How one request samples: temperature 0 means greedy; top_k 0 and min_p 0 are off."""

    temperature: float = 1.0
    top_p: float = 0.95
    max_new_tokens: int = 256
    seed: int | None = None
    top_k: int = 0  # keep the k most probable tokens (ties at the k-th kept)
    min_p: float = 0.0  # keep tokens with probability >= min_p * the most probable one's

    def __post_init__(self):
        check_range("temperature", self.temperature, 0.0)
        check_range("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        check_range("max_new_tokens", self.max_new_tokens, 1)
        check_range("top_k", self.top_k, 0)
        check_range("min_p", self.min_p, 0.0, 1.0)


@dataclass(frozen=True)
class EstimatorConfig:
    """Online acceptance estimator (docs/estimator.md): p_i = sigmoid(slope * f + intercept_i)."""

    feature: str = "logit_qmax"
    init_slope: float = 0.5
    init_intercept: float = -0.2
    refit_interval: int = 100  # engine steps per refit round
    ridge: float = 1e-3
    damping: float = 50.0  # update scaled by n / (n + damping)

    def __post_init__(self):
        check_range("refit_interval", self.refit_interval, 1)
        check_range("ridge", self.ridge, 0.0)
        check_range("damping", self.damping, 0.0)


@dataclass(frozen=True)
class ForgettingConfig:
    """`forgetting_logistic` (estimators/forgetting_logistic.py): the same model as EstimatorConfig's,
    refit from exponentially forgotten curvature, more often while young, faster after a shift."""

    half_life: float = 2000.0  # engine steps after which past evidence weighs half
    young_interval: int = 5  # first round's engine steps; doubles every refit up to EstimatorConfig's
    shift_z: float = 4.0  # |calibration z| of a round above this: a workload shift
    shift_keep: float = 0.2  # share of past evidence kept after a shift
    prior_slots: float = 50.0  # weight of the start coefficients, in pseudo-slots per position

    def __post_init__(self):
        check_range("half_life", self.half_life, 0.0, lo_open=True)
        check_range("young_interval", self.young_interval, 1)
        check_range("shift_z", self.shift_z, 0.0, lo_open=True)
        check_range("shift_keep", self.shift_keep, 0.0, 1.0)
        check_range("prior_slots", self.prior_slots, 0.0, lo_open=True)


# ---- fit (issue 2: offline core) ----
FIT_MODES = ("online", "batch")
FIT_ENGINES = ("memory", "streaming", "ray")
ONLINE_ESTIMATORS = ("online_logistic", "forgetting_logistic")  # what `avkit fit --estimator` replays
DEFAULT_TRACE_GLOB = "traces/*.parquet"  # the shipped traces `avkit fit` uses with no TRACE argument


@dataclass(frozen=True)
class FitConfig:
    """`avkit fit`: replay traces in engine-step order, fit an estimator per feature, score it.
    The estimator itself (feature written to coefficients.json, refit interval, ridge, damping)
    is an EstimatorConfig."""

    mode: str = "online"  # online: refit rounds as live (scores use predictions made when drafting);
    # batch: the same Newton step iterated to convergence on all observed rows
    estimator: str = "online_logistic"  # online mode: the estimator replayed and written (ONLINE_ESTIMATORS)
    n_bins: int = 10  # ECE bins
    max_iter: int = 50  # batch Newton iterations
    tol: float = 1e-10  # batch convergence: max |step| of any coefficient
    workers: int = 2  # threads fitting and scoring features (memory) or shards (streaming) in parallel
    coefficients: str = ""  # online mode: warm-start the written estimator from this file ("" = start constants)
    out: str = "reports/fit"
    engine: str = "memory"  # memory: every observed slot in RAM; streaming: out of core, passes over
    # shards in bounded chunks (fit/streaming.py); ray: the same passes as tasks on a Ray cluster
    memory_budget_mb: int = 1536  # streaming/ray: peak memory a fit process aims to stay under
    auc_bins: int = 1 << 16  # streaming/ray: rank-histogram bins per group (AUC error bound, metrics/binned.py)
    address: str | None = None  # ray: cluster address (None starts a local cluster)
    scratch: str | None = None  # streaming/ray: directory for the spilled observed slots (None: system temp)

    def __post_init__(self):
        check_choice("mode", self.mode, FIT_MODES)
        check_choice("estimator", self.estimator, ONLINE_ESTIMATORS)
        check_choice("engine", self.engine, FIT_ENGINES)
        check_range("memory_budget_mb", self.memory_budget_mb, 256)
        check_range("auc_bins", self.auc_bins, 16, 1 << 24)
        if self.engine != "memory" and self.mode != "batch":
            from avkit.errors import ConfigError

            raise ConfigError(f"--engine {self.engine} fits --mode batch (passes over the shards); the online "
                              "replay reads its traces into memory: use --engine memory for --mode online")
        check_range("n_bins", self.n_bins, 1)
        check_range("max_iter", self.max_iter, 1)
        check_range("tol", self.tol, 0.0, lo_open=True)
        check_range("workers", self.workers, 1)


@dataclass(frozen=True)
class SyntheticConfig:
    """A synthetic trace with known truth: P(accept slot i) = sigmoid(slope * logit_qmax + intercepts[i]),
    censored after the first rejection and after a randomly trimmed verify prefix."""

    num_slots: int = 100_000  # draft slots (rows), rounded up to whole (request, step) pairs of K
    k: int = DEFAULT_K
    slope: float = 0.55
    intercepts: tuple[float, ...] = (1.0, 0.8, 0.6, 0.45, 0.3, 0.2, 0.1)  # one per position, len K
    datasets: tuple[str, ...] = ("code", "chat")
    mix: tuple[float, ...] = (0.5, 0.5)  # share of requests per dataset
    feature_means: tuple[float, ...] = (2.5, 1.0)  # mean logit_qmax per dataset
    feature_sd: float = 2.0
    depth_drift: float = -0.25  # mean logit_qmax shift per draft position
    batch_size: int = 8  # requests per engine step
    steps_per_request: int = 64
    trim_prob: float = 0.2  # chance that a (request, step) verifies only a random prefix
    seed: int = 0

    def __post_init__(self):
        check_range("num_slots", self.num_slots, 1)
        check_range("k", self.k, 1, 64)
        check_range("feature_sd", self.feature_sd, 0.0)
        check_range("batch_size", self.batch_size, 1)
        check_range("steps_per_request", self.steps_per_request, 1)
        check_range("trim_prob", self.trim_prob, 0.0, 1.0)
        for name, n in (("intercepts", self.k), ("mix", len(self.datasets)),
                        ("feature_means", len(self.datasets))):
            if len(getattr(self, name)) != n:
                from avkit.errors import ConfigError

                raise ConfigError(f"{name} must have {n} entries, got {getattr(self, name)!r}")


# ---- runtime (issue: runtime core) ----


KERNEL_BACKENDS = ("auto", "torch", "triton")  # avkit/kernels/dispatch.py BACKENDS


@dataclass(frozen=True)
class EngineConfig:
    """The speculative decoding engine: K drafts per request and step, batch and context limits.

    k = 0 (or no drafter) is target-only decoding. `seed` is used for requests whose
    SamplingConfig has no seed of its own.
    """

    k: int = DEFAULT_K  # draft tokens proposed per request and step
    max_batch: int = 8  # concurrent requests (KV-cache slots)
    max_len: int = 2048  # tokens per sequence: prompt + output (+ K draft slots in flight)
    seed: int = 0
    # hot-path kernels (avkit/kernels/dispatch.py): auto = Triton on CUDA, the torch references on CPU;
    # triton on a CPU runs Triton's interpreter (TRITON_INTERPRET=1 set before triton is imported)
    kernels: str = "auto"

    def __post_init__(self):
        check_range("k", self.k, 0, 64)
        check_range("max_batch", self.max_batch, 1)
        check_range("max_len", self.max_len, self.k + 2)
        check_choice("kernels", self.kernels, KERNEL_BACKENDS)


# ---- record (issue: record) ----
DEFAULT_RECORD_DATASETS = ("humaneval", "mtbench")


@dataclass(frozen=True)
class RecordConfig:
    """`avkit record`: run workloads through the engine and stream one trace row per draft slot.

    The default is a small seeded HumanEval + MT-Bench mix with the real pair that finishes in
    minutes on 2 CPU cores. `num_prompts` is per dataset; MT-Bench adds its second turns.
    """

    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    datasets: tuple[str, ...] = DEFAULT_RECORD_DATASETS  # workload names or .jsonl files
    num_prompts: int = 4  # prompts per dataset (first turns)
    max_new_tokens: int = 256
    max_prompt_tokens: int = 768  # longer prompts are skipped (prefill dominates CPU time)
    k: int = DEFAULT_K
    temperature: float = 1.0
    top_p: float = 0.95
    concurrency: int = 8  # requests decoding at once (engine max_batch)
    seed: int = 0
    out: str = "traces/record.parquet"
    resume: bool = False  # continue an existing file: finished requests are skipped
    overwrite: bool = False  # replace an existing file (only when the new run finishes; see avkit/record)
    slots_per_dataset: int = 0  # stop admitting a dataset's prompts after this many labelled slots (0 = off)
    row_group_rows: int = 65536
    flush_interval_s: float = 60.0  # also flush (and make the partial file readable) this often
    device: str = "auto"  # auto (a GPU if torch sees one) | cpu | cuda[:N]
    dtype: str = "auto"  # both models: auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 (~3x on AVX512-BF16)
    threads: int = 0  # torch intra-op threads (0 = torch's default); 1 is fastest on an oversubscribed CPU
    drafter: str = "model"  # model: the draft model; hybrid: suffix cache or draft model per step (HVD)
    payoff: str = ""  # hybrid: payoff_mlp.pt written by `avkit hvd` ("" = ArcticInference's rule)
    kernels: str = EngineConfig.kernels  # hot-path kernels: auto | torch | triton (EngineConfig)

    def __post_init__(self):
        from avkit.errors import ConfigError

        check_placement(self.device, self.dtype)
        check_choice("drafter", self.drafter, ("model", "hybrid"))
        check_choice("kernels", self.kernels, KERNEL_BACKENDS)
        if not self.datasets:
            raise ConfigError(f"datasets must name at least one workload, got {self.datasets!r}")
        check_range("num_prompts", self.num_prompts, 1)
        check_range("max_new_tokens", self.max_new_tokens, 1)
        check_range("max_prompt_tokens", self.max_prompt_tokens, 1)
        check_range("k", self.k, 0, 64)
        check_range("temperature", self.temperature, 0.0)
        check_range("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        check_range("concurrency", self.concurrency, 1)
        check_range("slots_per_dataset", self.slots_per_dataset, 0)
        check_range("threads", self.threads, 0)
        check_range("row_group_rows", self.row_group_rows, 1)
        check_range("flush_interval_s", self.flush_interval_s, 0.0, lo_open=True)
        if not str(self.out).endswith(".parquet"):
            raise ConfigError(f"out must be a .parquet path, got {self.out!r}")
        if self.resume and self.overwrite:
            raise ConfigError("resume and overwrite exclude each other: continue the file or replace it")


# ---- adaptive verification / simulate / profile ----
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_COST_PATH = "~/.cache/avkit/cost.json"  # where `avkit profile` writes by default
PROFILE_CONTEXT_ENV = "AVKIT_PROFILE_CONTEXT_LEN"  # overrides ProfileConfig.context_len


@dataclass(frozen=True)
class AdaptiveConfig:
    """Budgeted verification (docs/budget.md): where the confidences and the step costs come from."""

    estimator: str = "online_logistic"  # a name in ESTIMATORS, or "none" (verify everything)
    coefficients: str = ""  # coefficients.json warm start for the estimator ("" = its defaults)
    cost: str = ""  # cost table JSON or roofline:GPU:MODEL ("" = DEFAULT_COST_PATH, else CPU roofline)
    history: int = 1000  # refits kept in the coefficient trajectory
    gate: bool = True  # may skip drafting for a step when no draft depth pays at its load (gate.py)
    gate_window: int = 64  # recent drafted request-steps the gate replays its step on
    probe_every: int = 256  # skipped steps in a row before the gate drafts again to re-measure
    resume_margin: float = 0.1  # gate off: resume drafting only when it promises > 10% more tokens/ms

    def __post_init__(self):
        check_range("history", self.history, 1)
        check_range("gate_window", self.gate_window, 1)
        check_range("probe_every", self.probe_every, 1)
        check_range("resume_margin", self.resume_margin, 0.0)


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
        check_range("k", self.k, 0)
        check_range("max_tokens", self.max_tokens, 1)
        check_range("max_requests", self.max_requests, 1)
        check_range("repeats", self.repeats, 1)
        check_range("warmup", self.warmup, 0)


@dataclass(frozen=True)
class SimulateConfig:
    """`avkit simulate`: trace replay of verify policies across concurrency (avkit/sim/replay.py)."""

    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    cost: str = "roofline:H200:8b"  # cost table JSON or roofline:GPU:TARGET[:DRAFT][:context=N,drafter=...]
    out: str = "reports/simulate.parquet"
    waves: int = 4  # each lane serves >= this many requests (recorded requests are cycled)
    estimators: tuple[str, ...] = ("online_logistic", "qmax")  # adaptive runs, one per estimator
    oracle: bool = True  # adaptive with confidences that know the recorded outcomes
    burn_in: bool = True  # online estimators start from one pass over the traces (no coefficients file)

    def __post_init__(self):
        from avkit.errors import ConfigError

        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError(f"concurrency must be positive integers, got {self.concurrency!r}")
        check_range("waves", self.waves, 1)


TUNE_FORMATS = ("table", "json", "vllm", "trtllm")


@dataclass(frozen=True)
class TuneConfig:
    """`avkit tune`: which K at which batch size, and whether adaptive verification pays (avkit/tune/)."""

    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    cost: str = "roofline:H200:8b"  # cost table JSON or roofline:GPU:TARGET[:DRAFT][:key=value,...]
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

    def __post_init__(self):
        from avkit.errors import ConfigError

        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError(f"--concurrency must be positive integers, got {self.concurrency!r}")
        if len(set(self.concurrency)) != len(self.concurrency):
            raise ConfigError(f"--concurrency has a repeated value: {self.concurrency!r}")
        check_range("--max-k", self.max_k, 0, 64)
        check_range("--tpot-slo-ms", self.tpot_slo_ms, 0.0)
        check_range("--context", self.context, 0)
        check_range("--memory-gb", self.memory_gb, 0.0)
        check_range("--memory-utilization", self.memory_utilization, 0.0, 1.0, lo_open=True)
        check_range("--waves", self.waves, 1)
        check_range("--bootstrap", self.bootstrap, 10)
        check_range("--level", self.level, 0.0, 1.0, lo_open=True, hi_open=True)
        check_choice("--format", self.format, TUNE_FORMATS)
        if not str(self.out).endswith(".json"):
            raise ConfigError(f"--out must be a .json path, got {self.out!r}")


# ---- hybrid verified decoding ----
@dataclass(frozen=True)
class SuffixCacheConfig:
    """SuffixDecoding cache drafter (docs/hvd.md); defaults follow vLLM's suffix decoding."""

    max_depth: int = 24  # longest suffix stored per position (trie depth)
    max_spec_factor: float = 1.0  # draft length <= match_len * factor + offset
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1  # stop when the path's frequency probability falls below this
    max_cached_requests: int = 100  # global tree: FIFO eviction by request beyond this many
    use_global: bool = True  # also draft from past responses

    def __post_init__(self):
        check_range("max_depth", self.max_depth, 1)
        check_range("max_spec_factor", self.max_spec_factor, 0.0)
        check_range("max_spec_offset", self.max_spec_offset, -1e9)
        check_range("min_token_prob", self.min_token_prob, 0.0, 1.0)
        check_range("max_cached_requests", self.max_cached_requests, 0)


@dataclass(frozen=True)
class HvdCostConfig:
    """Cost of one decoding cycle, in units of one target forward (HVD replay throughput)."""

    verify_token_cost: float = 0.02  # extra target cost per verified draft token
    draft_step_cost: float = 0.33  # one draft-model step (CPU: ~3 vs ~9 tok/s, docs/runtime.md)
    cache_cost: float = 0.005  # suffix lookup + payoff predictor

    def __post_init__(self):
        check_range("verify_token_cost", self.verify_token_cost, 0.0)
        check_range("draft_step_cost", self.draft_step_cost, 0.0)
        check_range("cache_cost", self.cache_cost, 0.0)


@dataclass(frozen=True)
class PayoffConfig:
    """Payoff MLP (predicts the cache draft's accepted length) and its training run."""

    hidden: int = 64
    layers: int = 2
    epochs: int = 30
    batch_size: int = 1024
    lr: float = 3e-3
    weight_decay: float = 1e-4
    val_fraction: float = 0.2  # requests held out to choose tau (split by request, never by row)
    test_fraction: float = 0.2  # requests held out for the reported metrics
    seed: int = 0

    def __post_init__(self):
        check_range("hidden", self.hidden, 1)
        check_range("layers", self.layers, 1)
        check_range("epochs", self.epochs, 1)
        check_range("batch_size", self.batch_size, 1)
        check_range("lr", self.lr, 0.0, lo_open=True)
        check_range("weight_decay", self.weight_decay, 0.0)
        check_range("val_fraction", self.val_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
        check_range("test_fraction", self.test_fraction, 0.0, 1.0 - self.val_fraction, hi_open=True)


@dataclass(frozen=True)
class HvdReplayConfig:
    """Trace replay for hybrid verified decoding."""

    k: int = DEFAULT_K  # model drafter's draft length; also caps cache drafts
    history_window: int = 16  # positions in the recent-acceptance features
    high_payoff: int = 6  # precision/recall threshold on accepted length (the paper's >= 6)

    def __post_init__(self):
        check_range("k", self.k, 1)
        check_range("history_window", self.history_window, 1)
        check_range("high_payoff", self.high_payoff, 1)


# ---- serve ----
SERVE_STATE_DIR = "~/.cache/avkit/serve"  # default home of the coefficient snapshot
SHIPPED_COEFFICIENTS = "traces/coefficients.json"  # fitted on the shipped traces (repo-relative)


@dataclass(frozen=True)
class ServeConfig:
    """`avkit serve`: the OpenAI-compatible server around the engine (issue 8).

    Admission: at most `max_concurrency` requests decode at once (the engine's batch) and at most
    `queue_size` more wait; beyond that a request gets 429 + Retry-After.
    """

    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT  # "" or "none": target-only decoding
    drafter: str = "model"  # model | hybrid (suffix cache + draft model behind the payoff router)
    payoff: str = ""  # hybrid: payoff_mlp.pt from `avkit hvd` ("" = ArcticInference's rule)
    policy: str = "adaptive"  # a name in avkit.scheduling.policy.POLICIES
    estimator: str = "online_logistic"  # adaptive policy's estimator (a name in ESTIMATORS)
    refit_interval: int = EstimatorConfig().refit_interval  # engine steps per online refit round
    coefficients: str = ""  # deployed coefficients.json for the warm start ("" = shipped default)
    cost: str = ""  # cost table JSON for the adaptive budget ("" = the policy's default)
    draft_gate: bool = AdaptiveConfig().gate  # adaptive: skip drafting in steps where no draft depth pays
    snapshot: str = ""  # where live coefficients are snapshotted ("" = SERVE_STATE_DIR/coefficients.json)
    snapshot_every: int = 10  # snapshot every M refits (and on shutdown)
    resume: bool = True  # warm-start from the snapshot when it exists
    record: str = ""  # stream per-draft trace rows to this Parquet file while serving
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str = ""  # require `Authorization: Bearer KEY` on every endpoint but /health
    served_model_name: str = ""  # name in /v1/models and responses ("" = the target id)
    max_concurrency: int = 8  # requests decoding at once (engine batch)
    queue_size: int = 64  # requests waiting beyond max_concurrency before 429
    max_len: int = 2048  # context limit: prompt + completion (+ K draft slots)
    max_tokens_limit: int = 1024  # largest max_tokens a request may ask for
    default_max_tokens: int = 256  # chat default when the request sets none
    k: int = DEFAULT_K
    seed: int = 0
    device: str = "auto"  # auto (a GPU if torch sees one) | cpu | cuda[:N]
    dtype: str = "auto"  # auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16
    grace_period_s: float = 10.0  # SIGTERM: finish in-flight requests for this long, then cancel
    retry_after_s: int = 1  # Retry-After header on 429
    max_body_bytes: int = 8 * 2**20  # larger request bodies get 413 (read before any parsing)
    log_requests: bool = False  # one access-log line per request (method, path, status, tokens, seconds)
    record_flush_s: float = 30.0  # --record: write buffered trace rows to disk this often
    kernels: str = EngineConfig.kernels  # hot-path kernels: auto | torch | triton (EngineConfig)

    def __post_init__(self):
        check_choice("drafter", self.drafter, ("model", "hybrid"))
        check_choice("kernels", self.kernels, KERNEL_BACKENDS)
        check_placement(self.device, self.dtype)
        check_range("port", self.port, 0, 65535)
        check_range("max_concurrency", self.max_concurrency, 1)
        check_range("queue_size", self.queue_size, 0)
        check_range("k", self.k, 0)
        check_range("max_len", self.max_len, self.k + 2)
        check_range("max_tokens_limit", self.max_tokens_limit, 1)
        check_range("default_max_tokens", self.default_max_tokens, 1, self.max_tokens_limit)
        check_range("snapshot_every", self.snapshot_every, 1)
        check_range("refit_interval", self.refit_interval, 1)
        check_range("grace_period_s", self.grace_period_s, 0.0)
        check_range("retry_after_s", self.retry_after_s, 0)
        check_range("max_body_bytes", self.max_body_bytes, 1)
        check_range("record_flush_s", self.record_flush_s, 0.0)


# ---- report ----
@dataclass(frozen=True)
class ReportConfig:
    """`avkit report`: HTML + Markdown + PNG from a fit directory, simulation and HVD results.

    `sim` and `hvd` are read when the files exist (the default outputs of `avkit simulate` and
    `avkit hvd`); a missing input omits its section with a note, never an error.
    """

    out: str = "reports/report"
    sim: str = "reports/simulate.parquet"  # `avkit simulate` results (one row per concurrency x policy)
    hvd: str = "reports/hvd/hvd_metrics.json"  # `avkit hvd` results
    tune: str = "reports/tune.json"  # `avkit tune` results (its section is left out when absent)
    n_bins: int = 10  # reliability-diagram bins (equal-width in predicted probability, as the fit's ECE)
    dpi: int = 120
    embed_images: bool = True  # index.html carries the PNGs as data URIs (portable); they are written beside too

    def __post_init__(self):
        check_range("n_bins", self.n_bins, 2, 100)
        check_range("dpi", self.dpi, 50, 600)



__all__ = ["DEFAULT_K", "EstimatorConfig", "ForgettingConfig", "SamplingConfig", "check_choice", "default_of"]
