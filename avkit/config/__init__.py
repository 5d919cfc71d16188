"""Frozen configuration dataclasses, one per component; every default lives here once.

A command's config is composed of the narrow configs of the components it drives (`ServeConfig.engine`
is the `EngineConfig` the engine gets), so each field is declared and validated in one place. A field's
name is its option's (`concurrency` is `--concurrency`), so a ConfigError names the option and the value
as typed; the CLI takes each option's default from its field (``default_of(Cls, "engine.k")``).
"""

from avkit.config.engine import (
    DRAFTERS, KERNEL_BACKENDS, SERVE_STATE_DIR, AdaptiveConfig, EngineConfig, EstimatorConfig, ForgettingConfig,
    HttpConfig, ModelsConfig, PlattConfig, RecordConfig, SamplingConfig, ServeConfig)
from avkit.config.fields import (
    DEFAULT_DRAFT, DEFAULT_K, DEFAULT_TARGET, DEFAULT_TRACE_GLOB, MAX_K, SHIPPED_COEFFICIENTS, SHIPPED_COST,
    default_of, shipped_file)
from avkit.config.fit import FitConfig, ReportConfig, SyntheticConfig
from avkit.config.hvd import HvdCostConfig, HvdReplayConfig, PayoffConfig, SuffixCacheConfig
from avkit.config.simulate import (DEFAULT_COST_PATH, PROFILE_CONTEXT_ENV, ProfileConfig, SimulateConfig, TuneConfig,
                                   default_cost_spec)

__all__ = [
    "DEFAULT_COST_PATH", "DEFAULT_DRAFT", "DEFAULT_K", "DEFAULT_TARGET", "DEFAULT_TRACE_GLOB", "DRAFTERS",
    "KERNEL_BACKENDS", "MAX_K", "PROFILE_CONTEXT_ENV", "SERVE_STATE_DIR", "SHIPPED_COEFFICIENTS", "SHIPPED_COST",
    "AdaptiveConfig", "EngineConfig", "EstimatorConfig", "FitConfig", "ForgettingConfig",
    "HttpConfig", "HvdCostConfig", "HvdReplayConfig", "ModelsConfig", "PayoffConfig", "PlattConfig", "ProfileConfig",
    "RecordConfig", "ReportConfig", "SamplingConfig", "ServeConfig", "SimulateConfig", "SuffixCacheConfig",
    "SyntheticConfig", "TuneConfig", "default_cost_spec", "default_of", "shipped_file",
]
