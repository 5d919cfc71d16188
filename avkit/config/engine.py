"""The engine, the models it runs, how one request samples, the acceptance estimator and adaptive
verification it runs with (docs/estimator.md, docs/budget.md), and the two commands composed of them:
`avkit record` and `avkit serve`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from avkit.config.fields import DEFAULT_DRAFT, DEFAULT_K, DEFAULT_TARGET, MAX_K, Checked, checked
from avkit.errors import ConfigError
from avkit.validate import check_placement, in_range, shown

DRAFTERS = ("model", "hybrid")
RUN_ENGINES = ("native", "vllm")  # `--engine` of record and profile: avkit's runtime | vLLM's offline engine
KERNEL_BACKENDS = ("auto", "torch", "triton")  # avkit/kernels/dispatch.py select_kernels
DEFAULT_RECORD_DATASETS = ("humaneval", "mtbench")
SERVE_STATE_DIR = "~/.cache/avkit/serve"  # default home of the coefficient snapshot


ENGINE_HELP = "native (avkit's runtime) | vllm (vLLM's offline engine in its own venv, docs/vllm.md)"
VLLM_PYTHON_HELP = "--engine vllm: that venv's python (default $AVKIT_VLLM_PYTHON, else .venv-vllm/bin/python)"


@dataclass(frozen=True)
class EngineConfig(Checked):
    """The speculative decoding engine: K drafts per request and step, batch and context limits.

    k = 0 (or no drafter) is target-only decoding. `seed` is used for requests whose
    SamplingConfig has no seed of its own.
    """

    k: int = checked(DEFAULT_K, 0, MAX_K, help="draft tokens per step", flags=("-k", "--k"))
    concurrency: int = checked(8, 1, help="requests decoding at once")  # KV-cache slots
    # tokens per sequence: prompt + output (+ K draft slots in flight)
    max_len: int = checked(2048, help="context limit in tokens")
    seed: int = checked(0, help="engine seed")
    # hot-path kernels (avkit/kernels/dispatch.py); triton on a CPU: set before triton is imported
    kernels: str = checked("auto", choices=KERNEL_BACKENDS, help=(
        "hot-path kernels: auto (Triton on CUDA, torch elsewhere) | torch | triton (on a CPU: Triton's interpreter, "
        "TRITON_INTERPRET=1)"))

    def __post_init__(self):
        super().__post_init__()
        in_range(self, "max_len", self.k + 2)


@dataclass(frozen=True)
class ModelsConfig(Checked):
    """The target/draft pair, the drafter in front of the draft model, and where they run."""

    target: str = checked(DEFAULT_TARGET, help="target model: alias, HF directory or GGUF file")
    draft: str = checked(DEFAULT_DRAFT, help="draft model ('none' = target-only decoding)")  # or ""
    drafter: str = checked("model", choices=DRAFTERS, help="model | hybrid (suffix cache or draft model per step)")
    payoff: str = checked("", help=(  # hybrid, from `avkit hvd`
        "hybrid: payoff_mlp.pt (threshold) or payoff_survival.pt (cache and model drafts share one verification "
        "budget) from `avkit hvd` (default: ArcticInference's rule)"))
    device: str = checked("auto", help="auto (a GPU if torch sees one) | cpu | cuda[:N]")
    dtype: str = checked("auto", help="model dtype: auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 "
                                      "(~3x float32 on AVX512-BF16 CPUs)")

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

    temperature: float = checked(1.0, 0.0, help="sampling temperature (0 = greedy)")
    top_p: float = checked(0.95, 0.0, 1.0, lo_open=True, help="top-p of target and draft sampling")
    max_new_tokens: int = checked(256, 1, help="tokens generated per request at most")
    seed: int | None = None
    top_k: int = checked(0, 0)  # keep the k most probable tokens (ties at the k-th kept)
    min_p: float = checked(0.0, 0.0, 1.0)  # keep tokens with probability >= min_p * the most probable one's


@dataclass(frozen=True)
class EstimatorConfig(Checked):
    """Online acceptance estimator (docs/estimator.md): p_i = sigmoid(slope * f + intercept_i)."""

    feature: str = checked("logit_qmax", help="lossless feature written to coefficients.json")
    init_slope: float = 0.5
    init_intercept: float = -0.2
    refit_interval: int = checked(100, 1, help="engine steps per online refit round")
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
class PlattConfig(Checked):
    """`forgetting_platt` (estimators/platt.py): forgetting_logistic's logit through an online Platt map
    p' = sigmoid(a z + b), refit from the served slots' own past labels."""

    prior: float = checked(1000.0, 0.0, lo_open=True)  # Gaussian prior's precision at (a, b) = (1, 0); inf: no map
    every: int = checked(10, 1)  # engine steps per Platt round


@dataclass(frozen=True)
class AdaptiveConfig(Checked):
    """Budgeted verification (docs/budget.md): where the confidences and the step costs come from."""

    # a name in ESTIMATORS, or "none" (verify everything)
    estimator: str = checked("online_logistic", help="adaptive policy's estimator (registry name)")
    # "" = the estimator's defaults
    coefficients: str = checked("", help="deployed coefficients.json (warm start; wins over an existing snapshot)")
    # the suffix cache's rows (hybrid drafter): their own estimator, warm-started from a file fitted on
    # cache rows ("" = the reference constants, refit from cache rows)
    cache_coefficients: str = checked("", help=(
        "hybrid drafter: coefficients.json for the suffix cache's rows, fitted on them (`avkit fit --drafter "
        "suffix`); default: their own estimator from the reference constants"))
    # "" = default_cost_spec(): the profiled table on this machine, else the CPU roofline
    cost: str = checked("", help="cost table JSON from `avkit profile`, or roofline:GPU:MODEL")
    history: int = checked(1000, 1)  # refits kept in the coefficient trajectory
    draft_gate: bool = True  # may skip drafting for a step when no draft depth pays at its load (gate.py)
    gate_window: int = checked(64, 1)  # recent drafted request-steps the gate replays its step on
    probe_every: int = checked(256, 1)  # skipped steps in a row before the gate drafts again to re-measure
    resume_margin: float = checked(0.1, 0.0)  # gate off: resume drafting only when it promises > 10% more tok/ms
    learn_cost: bool = False  # learn the cost model from the engine's step times (scheduling/learn.py; serve: on)
    # learning: every this many steps a probe verifies a depth set by the step count
    cost_probe_every: int = checked(16, 0)


@dataclass(frozen=True)
class RecordConfig(Checked):
    """`avkit record`: run workloads through the engine and stream one trace row per draft slot.

    The default is a small seeded HumanEval + MT-Bench mix with the real pair that finishes in
    minutes on 2 CPU cores. `num_prompts` is per dataset; MT-Bench adds its second turns.
    """

    models: ModelsConfig = field(default_factory=ModelsConfig)
    # how the pair decodes: k, concurrency (requests decoding at once), seed (prompt order and sampling),
    # kernels; the context limit is sized by `decoding_for_run` from the prompt and generation caps
    decoding: EngineConfig = field(default_factory=EngineConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # temperature, top_p, max_new_tokens
    # workload names or .jsonl files; its help names the workloads (avkit/cli/record.py)
    dataset: tuple[str, ...] = checked(DEFAULT_RECORD_DATASETS, repeat=True)
    num_prompts: int = checked(4, 1, help="prompts per dataset")  # first turns
    # longer prompts are skipped (prefill dominates CPU time)
    max_prompt_tokens: int = checked(768, 1, help="skip prompts longer than this")
    out: str = checked("traces/record.parquet", help="trace file (.parquet); generations go beside it")
    resume: bool = checked(False, help="continue OUT: skip finished requests (refused when OUT was recorded with "
                                       "another K, temperature, top-p, drafter or model)")
    overwrite: bool = checked(False, help="replace an existing OUT; the old files stay until the new run finishes")
    slots_per_dataset: int = checked(0, 0, help="stop admitting a dataset after this many labelled slots (0 = off)")
    row_group_rows: int = checked(65536, 1)
    # also flush (and make the partial file readable) this often
    flush_interval: float = checked(60.0, 0.0, lo_open=True, help="seconds between flushes to disk")
    threads: int = checked(0, 0, help="torch threads (0 = default; 1 on a busy CPU)")
    engine: str = checked("native", choices=RUN_ENGINES, help=ENGINE_HELP)
    vllm_python: str = checked("", help=VLLM_PYTHON_HELP)
    vllm_draft_sampling: str = checked("probabilistic", choices=("probabilistic", "greedy"), help=(
        "--engine vllm, T > 0: probabilistic (draw drafts from q) | greedy (argmax drafts)"))
    # a spec (avkit/scheduling/spec.py)
    policy: str = checked("full", help="verify policy: full, fixed:K, adaptive[-stop][-nogate]:ESTIMATOR, "
                                       "schedule:FILE (avkit tune --out); trimmed slots are recorded unverified "
                                       "(censored)")
    cost: str = checked("", help="adaptive policies: cost table JSON (avkit profile) or roofline:GPU:TARGET "
                                 "(default: the profiled table, else the CPU roofline)")
    coefficients: str = checked("", help="adaptive policies: coefficients.json warm start of the estimator "
                                         "(default: vLLM's reference constants)")
    learn_cost: bool = checked(False, help="adaptive policies: learn the cost model from this run's step times, as "
                                           "avkit serve does (decisions then depend on the machine's timing)")
    cost_out: str = checked("", help="with --learn-cost: write the learned cost model here at the end (as avkit "
                                     "serve snapshots it; simulate and tune take it as --cost)")

    def __post_init__(self):
        if not self.dataset:
            raise ConfigError("--dataset must name at least one workload")
        super().__post_init__()
        if not str(self.out).endswith(".parquet"):
            raise ConfigError(f"--out must be a .parquet path, got {shown(self.out)}")
        if self.policy != "full" and self.engine != "native":
            raise ConfigError(f"--policy {self.policy} runs in avkit's own engine only (--engine {self.engine} "
                              "verifies with its own rule)")
        if self.engine == "vllm" and self.slots_per_dataset:
            raise ConfigError("--slots-per-dataset runs in avkit's own engine only (--engine vllm hands vLLM every "
                              "prompt up front)")
        if self.resume and self.overwrite:
            raise ConfigError("--resume and --overwrite exclude each other: continue the file or replace it")
        if self.learn_cost and not self.policy.startswith("adaptive"):
            raise ConfigError(f"--learn-cost needs an adaptive policy (fixed and scheduled ones price nothing), got "
                              f"--policy {shown(self.policy)}")
        if self.cost_out and not self.learn_cost:
            raise ConfigError(f"--cost-out {shown(self.cost_out)} needs --learn-cost (it writes what the policy "
                              "learned)")

    @property
    def decoding_for_run(self) -> EngineConfig:
        """The engine config with room for the longest admitted prompt, its generation and K drafts."""
        return replace(self.decoding,
                       max_len=self.max_prompt_tokens + self.sampling.max_new_tokens + self.decoding.k + 2)


@dataclass(frozen=True)
class HttpConfig(Checked):
    """The OpenAI-compatible front: where it listens, who may call it, how it admits and stops.

    Admission: at most the engine's `concurrency` requests decode at once and at most `queue_size`
    more wait; beyond that a request gets 429 + Retry-After.
    """

    host: str = checked("127.0.0.1", help="bind address (loopback by default)")
    port: int = checked(8000, 0, 65535, help="TCP port")
    # on every endpoint but /health
    api_key: str = checked("", help="require `Authorization: Bearer KEY`; prefer the AVKIT_API_KEY environment "
                                    "variable: a key on the command line is visible to every user in `ps`",
                           envvar="AVKIT_API_KEY", show_default=False)
    served_model_name: str = checked("", help="model name clients use (default: the target id)")
    queue_size: int = checked(64, 0, help="requests waiting beyond those before 429")
    retry_after_s: int = checked(1, 0)  # Retry-After header on 429
    # read before any parsing
    max_body_bytes: int = checked(8 * 2**20, 1, help="largest request body in bytes (413 beyond)")
    log_requests: bool = checked(False, help="one access-log line per request: method, path, status, tokens, "
                                             "seconds")
    # SIGTERM: finish in-flight requests for this long, then cancel (exit within ~5 s)
    grace_period: float = checked(3.0, 0.0, help="seconds to finish in-flight requests on SIGTERM")


@dataclass(frozen=True)
class ServeConfig(Checked):
    """`avkit serve`: the models, the engine (engine.concurrency = requests decoding at once),
    the online estimator's refits, the adaptive policy, the HTTP front, and what serve adds itself."""

    models: ModelsConfig = field(default_factory=ModelsConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)  # k, concurrency, max_len, seed
    online: EstimatorConfig = field(default_factory=EstimatorConfig)  # refit_interval of the live refits
    # estimator (a name in ESTIMATORS), coefficients (deployed file for the warm start; "" = the snapshot
    # or the shipped default, serve/server.py), cost ("" = the policy's default), draft_gate
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    # a name in POLICIES (avkit/scheduling/spec.py): its entry alone sets behaviour
    policy: str = checked("adaptive-stop", help=(
        "verify policy in simulate's --policy syntax: adaptive-stop[-nogate][:ESTIMATOR] (also stops drafting "
        "early; -nogate: never skips drafting a step) | adaptive[-nogate][:ESTIMATOR] | full | nospec | fixed[:K] "
        "(bare: -k) | schedule[:FILE] (K by batch size; bare: --schedule)"))
    schedule: str = checked("", help="--policy schedule: `avkit tune` results JSON or its --format vllm fragment")
    # "" = SERVE_STATE_DIR/coefficients.json
    snapshot: str = checked("", help="live coefficient snapshot (default ~/.cache/avkit/serve/coefficients.json)")
    snapshot_every: int = checked(10, 1, help="snapshot every M refits")  # and on shutdown
    resume: bool = checked(True, help="warm-start from the snapshot when it exists (and no --coefficients)")
    record: str = checked("", help="stream per-draft trace rows to this Parquet file")
    record_flush_s: float = checked(30.0, 0.0)  # --record: write buffered trace rows to disk this often
    max_new_tokens: int = checked(1024, 1, help="largest max_tokens a request may ask (new tokens per request)")
    default_max_tokens: int = 256  # chat default when the request sets none

    def __post_init__(self):
        super().__post_init__()
        in_range(self, "default_max_tokens", 1, self.max_new_tokens)
        if (self.policy == "schedule") != bool(self.schedule):
            raise ConfigError("--schedule FILE goes with --policy schedule (and only with it), got --policy "
                              f"{self.policy}, --schedule {shown(self.schedule)}")
