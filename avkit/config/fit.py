"""`avkit fit`, `avkit report` (which fits traces itself) and the synthetic traces with known truth."""

from __future__ import annotations

from dataclasses import dataclass

from avkit.config.fields import DEFAULT_K, MAX_K, Checked, checked
from avkit.errors import ConfigError
from avkit.validate import check_choice, option, shown

FIT_MODES = ("online", "batch")
FIT_ENGINES = ("memory", "streaming", "ray")
FIT_REPLICAS = ("chain", "independent")
FIT_DRAFTERS = ("model", "suffix")  # the trace's `drafter` values
ONLINE_ESTIMATORS = ("online_logistic", "forgetting_logistic", "forgetting_platt")  # what `avkit fit --estimator` replays


@dataclass(frozen=True)
class OutOfCoreConfig(Checked):
    """What `--engine streaming` (and ray) passes share, in `avkit fit` and `avkit report`."""

    memory_budget: int = checked(1536, 256, help="--engine streaming/ray: MB of memory to stay under")
    scratch: str | None = checked(None, help="--engine streaming/ray: directory for the spilled observed slots "
                                             "(default: system temp)", metavar="PATH", show_default=False)


@dataclass(frozen=True)
class FitConfig(OutOfCoreConfig):
    """`avkit fit`: replay traces in engine-step order, fit an estimator per feature, score it.
    The estimator itself (feature written to coefficients.json, refit interval, ridge, damping)
    is an EstimatorConfig. Which options go together is checked here, once (`__post_init__`); the
    one rule that involves the EstimatorConfig (`--features` holds `--feature`) is fit/run.py's."""

    mode: str = checked("online", choices=FIT_MODES, help=(
        "online: replay refit rounds as live (out-of-sample scores); batch: Newton to convergence (in-sample)"))
    estimator: str = checked("online_logistic", choices=ONLINE_ESTIMATORS, help=(
        "online estimator replayed and written to coefficients.json: online_logistic (vLLM's), "
        "forgetting_logistic or forgetting_platt"))
    bins: int = checked(10, 1, help="ECE bins")
    max_iter: int = checked(50, 1)  # batch Newton iterations
    tol: float = checked(1e-10, 0.0, lo_open=True)  # batch convergence: max |step| of any coefficient
    workers: int = checked(2, 1)  # threads fitting and scoring features (memory) or shards (streaming) in parallel
    # "" = the start constants
    coefficients: str = checked("", help="online: warm-start the written estimator from this coefficients file or "
                                         "serve snapshot (validated)")
    out: str = checked("reports/fit", help="output directory", metavar="PATH")
    # streaming: passes over shards in bounded chunks (fit/passes.py)
    engine: str = checked("memory", choices=FIT_ENGINES, help=(
        "memory: all observed slots in RAM; streaming: out of core in bounded chunks (--mode batch); ray: the same "
        "passes as Ray tasks (pip install 'avkit\\[distributed]')"))
    # streaming/ray: rank-histogram bins per group (AUC error bound, metrics/binned.py)
    auc_bins: int = checked(1 << 16, 16, 1 << 24)
    address: str | None = checked(None, help="--engine ray: cluster address (default: start a local cluster)",
                                  show_default=False)
    # the memory engine fits either, streaming/ray the model's
    drafter: str = checked("model", choices=FIT_DRAFTERS, help=(
        "the rows fitted: model (the draft model's) or suffix (a hybrid drafter's cache rows: their own "
        "coefficients, for `serve --cache-coefficients`)"))
    # online_replicas in fit/replay.py
    replicas: str = checked("chain", choices=FIT_REPLICAS, help=(
        "--mode online: chain = the files are one server's successive runs (one estimator carried through them); "
        "independent = each file is a replica with its own estimator, replayed in parallel (--engine ray: one Ray "
        "task per replica)"))
    # avkit.features.FEATURES; () = every feature in the traces plus the per-position-slope ablation
    features: tuple[str, ...] = checked((), help=(
        "fit and score only these features, comma-separated (e.g. logit_qmax: what a fleet deploys), --feature "
        "among them; default: every feature in the traces and the per-position-slope ablation of --feature"))

    def __post_init__(self):
        super().__post_init__()
        if self.mode == "batch" and self.estimator != "online_logistic":  # never ignored silently
            raise ConfigError(f"--estimator {self.estimator}: names the online estimator; --mode batch fits "
                              "batch_logistic (drop --estimator or use --mode online)")
        if self.drafter != "model" and self.engine != "memory":
            raise ConfigError(f"--drafter {self.drafter}: fitted by --engine memory only (streaming and ray fit "
                              "the draft model's rows)")
        if self.engine == "streaming" and self.mode != "batch":
            raise ConfigError("--engine streaming fits --mode batch (passes over the shards); the online "
                              "replay reads its traces into memory: use --engine memory or ray for --mode online")
        if self.engine == "ray" and self.mode == "online" and self.replicas != "independent":
            raise ConfigError("--engine ray --mode online replays each replica (trace file) on its own estimator, "
                              "in parallel: add --replicas independent (--replicas chain carries one estimator "
                              "through every file in turn, which only --engine memory runs)")
        if self.replicas != "chain" and self.mode != "online":
            raise ConfigError(f"--replicas {self.replicas}: only --mode online replays per replica "
                              "(a batch fit pools every shard)")
        if self.features:
            from avkit.features import FEATURES  # lazy: torch (avkit.features; config is imported at start-up)

            if not all(self.features):
                raise ConfigError(f"--features must be comma-separated feature names, got {shown(self.features)}")
            for name in self.features:
                check_choice("--features", name, FEATURES)
            if len(set(self.features)) < len(self.features):
                raise ConfigError(f"--features {shown(self.features)}: names a feature twice")


@dataclass(frozen=True)
class ReportConfig(OutOfCoreConfig):
    """`avkit report`: HTML + Markdown + PNG from a fit directory, simulation and HVD results.

    `sim` and `hvd` are read when the files exist (the default outputs of `avkit simulate` and
    `avkit hvd`); a missing input omits its section with a note, never an error. `memory_budget` and
    `scratch` are those of `--engine streaming`.
    """

    out: str = checked("reports/report", help="report directory (replaced atomically)", metavar="PATH")
    sim: str = "reports/simulate.parquet"  # `avkit simulate` results (one row per concurrency x policy)
    hvd: str = "reports/hvd/hvd_metrics.json"  # `avkit hvd` results
    tune: str = "reports/tune.json"  # `avkit tune` results (its section is left out when absent)
    # equal-width in predicted probability, as the fit's ECE
    bins: int = checked(10, 2, 100, help="reliability-diagram and ECE bins")
    dpi: int = checked(120, 50, 600)
    # the PNGs are written beside too
    embed: bool = checked(True, help="embed the PNGs in index.html")
    # report/traces.py
    engine: str = checked("memory", choices=("memory", "streaming"), help=(
        "memory: the traces in RAM; streaming: out of core, memory bounded by --memory-budget (a batch fit; no "
        "simulation unless --sim)"))

    def streaming(self):
        """The out-of-core FitConfig of `--engine streaming` (None: in memory)."""
        return None if self.engine == "memory" else FitConfig(
            mode="batch", engine="streaming", memory_budget=self.memory_budget, scratch=self.scratch)


@dataclass(frozen=True)
class SyntheticConfig(Checked):
    """A synthetic trace with known truth: P(accept slot i) = sigmoid(slope * logit_qmax + intercepts[i]),
    censored after the first rejection and after a randomly trimmed verify prefix."""

    num_slots: int = checked(100_000, 1)  # draft slots (rows), rounded up to whole (request, step) pairs of K
    k: int = checked(DEFAULT_K, 1, MAX_K)
    slope: float = 0.55
    intercepts: tuple[float, ...] = (1.0, 0.8, 0.6, 0.45, 0.3, 0.2, 0.1)  # one per position, len K
    datasets: tuple[str, ...] = ("code", "chat")
    mix: tuple[float, ...] = (0.5, 0.5)  # share of requests per dataset
    feature_means: tuple[float, ...] = (2.5, 1.0)  # mean logit_qmax per dataset
    feature_sd: float = checked(2.0, 0.0)
    depth_drift: float = -0.25  # mean logit_qmax shift per draft position
    batch_size: int = checked(8, 1)  # requests per engine step
    steps_per_request: int = checked(64, 1)
    trim_prob: float = checked(0.2, 0.0, 1.0)  # chance that a (request, step) verifies only a random prefix
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        for name, n in (("intercepts", self.k), ("mix", len(self.datasets)),
                        ("feature_means", len(self.datasets))):
            if len(getattr(self, name)) != n:
                raise ConfigError(f"{option(name)} must have {n} entries, got {shown(getattr(self, name))}")
