"""Command configs are composed of the narrow configs: one declaration and one bound per field."""

from __future__ import annotations

import dataclasses

import pytest

from avkit.config import (
    MAX_K, EngineConfig, HvdReplayConfig, ModelsConfig, ProfileConfig, RecordConfig, SamplingConfig, ServeConfig,
    SyntheticConfig, TuneConfig, default_of, named)
from avkit.errors import ConfigError


def test_command_configs_declare_no_field_of_their_parts():
    """RecordConfig / ServeConfig hold the narrow configs; none of their own fields repeats one of them."""
    for cls in (RecordConfig, ServeConfig):
        own = {f.name for f in dataclasses.fields(cls)}
        for f in dataclasses.fields(cls):
            if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
                part = {g.name for g in dataclasses.fields(f.default_factory)}
                assert not own & part, (cls.__name__, f.name, own & part)
    assert isinstance(RecordConfig().engine, EngineConfig) and isinstance(ServeConfig().models, ModelsConfig)


@pytest.mark.parametrize("make", [
    lambda k: EngineConfig(k=k), lambda k: SyntheticConfig(k=k, intercepts=(0.0,) * k),
    lambda k: TuneConfig(max_k=k), lambda k: ProfileConfig(k=k), lambda k: HvdReplayConfig(k=k)])
def test_one_bound_on_k_everywhere(make):
    make(MAX_K)
    with pytest.raises(ConfigError, match=rf"k must be in \[\d, {MAX_K}\], got {MAX_K + 1}"):
        make(MAX_K + 1)


def test_default_of_reads_nested_defaults():
    assert default_of(ServeConfig, "engine.k") == EngineConfig().k
    assert default_of(RecordConfig, "sampling.top_p") == SamplingConfig().top_p
    assert default_of(ServeConfig, "http.port") == 8000 and default_of(ServeConfig, "policy") == "adaptive"
    with pytest.raises(KeyError):
        default_of(ServeConfig, "max_concurrency")


def test_named_renames_only_the_named_field():
    with pytest.raises(ConfigError, match=r"^concurrency must be in \[1, inf\], got 0$"):
        with named(max_batch="concurrency"):
            EngineConfig(max_batch=0)
    with pytest.raises(ConfigError, match=r"^max_len must be in"):
        with named(max_batch="concurrency"):
            EngineConfig(max_len=1)


def test_record_sizes_its_engine_context():
    cfg = RecordConfig(engine=EngineConfig(k=3), sampling=SamplingConfig(max_new_tokens=10), max_prompt_tokens=20)
    assert cfg.engine_for_run == dataclasses.replace(cfg.engine, max_len=20 + 10 + 3 + 2)
