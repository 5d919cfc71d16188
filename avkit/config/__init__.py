"""Frozen configuration dataclasses, one per component; every default lives here once.

Each component receives the narrow config it uses; a command's config is composed of them
(`ServeConfig.engine` is the `EngineConfig` the engine gets), so each field is declared and
validated in one place. A field's name is its command-line option's (`concurrency` is
`--concurrency`), so a ConfigError names the option and the value as typed. The CLI builds its
options from these defaults (``default_of(Cls, "engine.k")``), so the two never drift.

  fields.py      DEFAULT_K, MAX_K, the default pair, `default_of`, `checked` fields and their `Checked` base
  engine.py      EngineConfig, ModelsConfig (pair, drafter, placement), SamplingConfig (per request)
  estimation.py  EstimatorConfig, ForgettingConfig, AdaptiveConfig
  fit.py         FitConfig (and OutOfCoreConfig, shared with ReportConfig), SyntheticConfig
  record.py      RecordConfig = models + engine + sampling + the recording
  simulate.py    ProfileConfig, SimulateConfig and TuneConfig (on a shared ReplayConfig)
  hvd.py         SuffixCacheConfig, HvdCostConfig, PayoffConfig, HvdReplayConfig
  serve.py       ServeConfig = models + engine + online + adaptive + http + serve's own; HttpConfig
  report.py      ReportConfig
  shipped.py     the shipped traces, coefficients and cost table, and where they are found
"""

from avkit.config.engine import DRAFTERS, KERNEL_BACKENDS, EngineConfig, ModelsConfig, SamplingConfig
from avkit.config.estimation import AdaptiveConfig, EstimatorConfig, ForgettingConfig
from avkit.config.fields import DEFAULT_DRAFT, DEFAULT_K, DEFAULT_TARGET, MAX_K, default_of
from avkit.config.fit import FitConfig, SyntheticConfig
from avkit.config.hvd import HvdCostConfig, HvdReplayConfig, PayoffConfig, SuffixCacheConfig
from avkit.config.record import RecordConfig
from avkit.config.report import ReportConfig
from avkit.config.serve import SERVE_STATE_DIR, HttpConfig, ServeConfig
from avkit.config.shipped import DEFAULT_TRACE_GLOB, SHIPPED_COEFFICIENTS, SHIPPED_COST, shipped_file
from avkit.config.simulate import DEFAULT_COST_PATH, PROFILE_CONTEXT_ENV, ProfileConfig, SimulateConfig, TuneConfig

__all__ = [
    "DEFAULT_COST_PATH", "DEFAULT_DRAFT", "DEFAULT_K", "DEFAULT_TARGET", "DEFAULT_TRACE_GLOB", "DRAFTERS",
    "KERNEL_BACKENDS", "MAX_K", "PROFILE_CONTEXT_ENV", "SERVE_STATE_DIR", "SHIPPED_COEFFICIENTS", "SHIPPED_COST",
    "AdaptiveConfig", "EngineConfig", "EstimatorConfig", "FitConfig", "ForgettingConfig",
    "HttpConfig", "HvdCostConfig", "HvdReplayConfig", "ModelsConfig", "PayoffConfig", "ProfileConfig",
    "RecordConfig", "ReportConfig", "SamplingConfig", "ServeConfig", "SimulateConfig", "SuffixCacheConfig",
    "SyntheticConfig", "TuneConfig", "default_of", "shipped_file",
]
