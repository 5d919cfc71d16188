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
    dataset: tuple[str, ...] = DEFAULT_RECORD_DATASETS  # workload names or .jsonl files (a repeated option)
    num_prompts: int = checked(4, 1)  # prompts per dataset (first turns)
    max_prompt_tokens: int = checked(768, 1)  # longer prompts are skipped (prefill dominates CPU time)
    out: str = "traces/record.parquet"
    resume: bool = False  # continue an existing file: finished requests are skipped
    overwrite: bool = False  # replace an existing file (only when the new run finishes; see avkit/record)
    # stop admitting a dataset's prompts after this many labelled slots (0 = off)
    slots_per_dataset: int = checked(0, 0)
    row_group_rows: int = checked(65536, 1)
    # also flush (and make the partial file readable) this often
    flush_interval: float = checked(60.0, 0.0, lo_open=True)
    # torch intra-op threads (0 = torch's default); 1 is fastest on an oversubscribed CPU
    threads: int = checked(0, 0)
    # native (avkit's runtime) | vllm (vLLM's offline engine, docs/vllm.md)
    engine: str = checked("native", choices=RUN_ENGINES)
    vllm_python: str = ""  # vllm: the venv's python ("" = $AVKIT_VLLM_PYTHON, else .venv-vllm/bin/python)
    # vllm, T > 0: draw drafts from q (probabilistic) or take argmax
    vllm_draft_sampling: str = checked("probabilistic", choices=("probabilistic", "greedy"))
    policy: str = "full"  # the verify policy recorded, a spec (avkit/scheduling/spec.py): full, fixed:K, adaptive:E, ...
    cost: str = ""  # adaptive policies' cost table ("" = AdaptiveConfig's default)
    coefficients: str = ""  # adaptive policies' estimator warm start (coefficients.json; "" = reference constants)

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

    host: str = "127.0.0.1"
    port: int = checked(8000, 0, 65535)
    api_key: str = ""  # require `Authorization: Bearer KEY` on every endpoint but /health
    served_model_name: str = ""  # name in /v1/models and responses ("" = the target id)
    queue_size: int = checked(64, 0)  # requests waiting beyond the engine's batch before 429
    retry_after_s: int = checked(1, 0)  # Retry-After header on 429
    max_body_bytes: int = checked(8 * 2**20, 1)  # larger request bodies get 413 (read before any parsing)
    log_requests: bool = False  # one access-log line per request (method, path, status, tokens, seconds)
    # SIGTERM: finish in-flight requests for this long, then cancel (exit within ~5 s)
    grace_period: float = checked(3.0, 0.0)


@dataclass(frozen=True)
class ServeConfig(Checked):
    """`avkit serve`: the models, the engine (engine.concurrency = requests decoding at once),
    the online estimator's refits, the adaptive policy, the HTTP front, and what serve adds itself."""

    models: ModelsConfig = field(default_factory=ModelsConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)  # k, concurrency, max_len, seed
    online: EstimatorConfig = field(default_factory=EstimatorConfig)  # refit_interval of the live refits
    # estimator (a name in ESTIMATORS), coefficients (deployed file for the warm start; "" = the snapshot
    # or the shipped default, serve/startup.py), cost ("" = the policy's default), draft_gate
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    policy: str = "adaptive-stop"  # a name in POLICIES (avkit/scheduling/spec.py): its entry alone sets behaviour
    schedule: str = ""  # policy "schedule": K by batch size, from `avkit tune` JSON or its vLLM fragment
    snapshot: str = ""  # where live coefficients are snapshotted ("" = SERVE_STATE_DIR/coefficients.json)
    snapshot_every: int = checked(10, 1)  # snapshot every M refits (and on shutdown)
    resume: bool = True  # warm-start from the snapshot when it exists
    record: str = ""  # stream per-draft trace rows to this Parquet file while serving
    record_flush_s: float = checked(30.0, 0.0)  # --record: write buffered trace rows to disk this often
    max_new_tokens: int = checked(1024, 1)  # largest max_tokens a request may ask for
    default_max_tokens: int = 256  # chat default when the request sets none

    def __post_init__(self):
        super().__post_init__()
        in_range(self, "default_max_tokens", 1, self.max_new_tokens)
        if (self.policy == "schedule") != bool(self.schedule):
            raise ConfigError("--schedule FILE goes with --policy schedule (and only with it), got --policy "
                              f"{self.policy}, --schedule {shown(self.schedule)}")
