"""Command configs are composed of the narrow configs: one declaration and one bound per field."""

from __future__ import annotations

import dataclasses

import pytest

from avkit.config import (
    MAX_K, EngineConfig, HvdReplayConfig, ModelsConfig, ProfileConfig, RecordConfig, SamplingConfig, ServeConfig,
    SyntheticConfig, TuneConfig, default_of)
from avkit.errors import ConfigError


def test_command_configs_declare_no_field_of_their_parts():
    """RecordConfig / ServeConfig hold the narrow configs; none of their own fields repeats one of them."""
    for cls in (RecordConfig, ServeConfig):
        own = {f.name for f in dataclasses.fields(cls)}
        for f in dataclasses.fields(cls):
            if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
                part = {g.name for g in dataclasses.fields(f.default_factory)}
                assert not own & part, (cls.__name__, f.name, own & part)
    assert isinstance(RecordConfig().decoding, EngineConfig) and isinstance(ServeConfig().models, ModelsConfig)


@pytest.mark.parametrize("make", [
    lambda k: EngineConfig(k=k), lambda k: SyntheticConfig(k=k, intercepts=(0.0,) * k),
    lambda k: TuneConfig(max_k=k), lambda k: ProfileConfig(k=k), lambda k: HvdReplayConfig(k=k)])
def test_one_bound_on_k_everywhere(make):
    make(MAX_K)
    with pytest.raises(ConfigError, match=rf"^-?-(max-)?k must be in \[\d, {MAX_K}\], got {MAX_K + 1}$"):
        make(MAX_K + 1)


def test_default_of_reads_nested_defaults():
    assert default_of(ServeConfig, "engine.k") == EngineConfig().k
    assert default_of(RecordConfig, "sampling.top_p") == SamplingConfig().top_p
    assert default_of(ServeConfig, "http.port") == 8000 and default_of(ServeConfig, "policy") == "adaptive-stop"
    with pytest.raises(KeyError):
        default_of(ServeConfig, "max_concurrency")


def test_errors_name_the_option_and_the_value_as_typed():
    with pytest.raises(ConfigError, match=r"^--concurrency must be >= 1, got -4$"):
        EngineConfig(concurrency=-4)
    with pytest.raises(ConfigError, match=r"^--top-p must be in \(0, 1\], got 1.5$"):
        SamplingConfig(top_p=1.5)
    with pytest.raises(ConfigError, match=r"^--concurrency must be integers >= 1, got 1,-4$"):
        TuneConfig(concurrency=(1, -4))
    with pytest.raises(ConfigError, match=r"^--kernels must be one of auto, torch, triton; got cuda$"):
        EngineConfig(kernels="cuda")


def _leaves(cls):
    for f in dataclasses.fields(cls):
        nested = isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory)
        yield from _leaves(f.default_factory) if nested else [f.name]


# options a command handles itself, outside its config (display, inputs, what it passes to the library)
OUTSIDE = {"record": {"progress"}, "serve": {"log_level"},
           "profile": set(),
           "tune": {"traces"}, "simulate": {"traces", "policy"},
           "fit": {"traces", "hvd"}, "report": {"inputs", "simulate"},
           "hvd": {"traces", "out", "tokenizer", "markdown", "synthetic", "cost_table"}}


def test_field_names_are_option_names():
    """Each option of a command is a field of the config it builds, spelled the same (dashes for
    underscores), or one it handles itself (OUTSIDE): no option is renamed on its way into a config."""
    from typer.main import get_command

    from avkit.cli import app
    from avkit.config import (EstimatorConfig, FitConfig, HvdCostConfig, PayoffConfig, ReportConfig, SimulateConfig,
                              SuffixCacheConfig)

    commands = get_command(app).commands
    for name, classes in (("record", [RecordConfig]), ("serve", [ServeConfig]), ("profile", [ProfileConfig]),
                          ("tune", [TuneConfig]), ("simulate", [SimulateConfig]), ("fit", [FitConfig, EstimatorConfig]),
                          ("report", [ReportConfig, FitConfig, EstimatorConfig]),
                          ("hvd", [HvdReplayConfig, SuffixCacheConfig, HvdCostConfig, PayoffConfig])):
        options = {p.name for p in commands[name].params}
        assert options - {f for cls in classes for f in _leaves(cls)} == OUTSIDE[name], name


def test_record_sizes_its_engine_context():
    cfg = RecordConfig(decoding=EngineConfig(k=3), sampling=SamplingConfig(max_new_tokens=10), max_prompt_tokens=20)
    assert cfg.decoding_for_run == dataclasses.replace(cfg.decoding, max_len=20 + 10 + 3 + 2)


def test_options_are_built_from_the_fields():
    """config_options: an option's help and default are its field's; a tuple is a comma-separated list (or a
    repeated option); the values come back as the nested config, the fields not given at their defaults."""
    import typer
    from typer.testing import CliRunner

    from avkit.cli.options import config_options

    got, app = {}, typer.Typer()
    app.command("record")(config_options(RecordConfig, "decoding.k", "dataset", "sampling.top_p")(
        lambda config: got.update(record=config)))
    app.command("tune")(config_options(TuneConfig, "concurrency", "datasets", "context_bands")(
        lambda config: got.update(tune=config)))
    run = CliRunner().invoke
    assert run(app, ["record", "-k", "3", "--dataset", "a", "--dataset", "b"]).exit_code == 0
    assert got["record"] == RecordConfig(decoding=EngineConfig(k=3), dataset=("a", "b"))
    assert run(app, ["record"]).exit_code == 0 and got["record"] == RecordConfig()
    assert run(app, ["tune", "--concurrency", "1,4", "--datasets", "x, y"]).exit_code == 0
    assert got["tune"] == TuneConfig(concurrency=(1, 4), datasets=("x", "y"))
    assert run(app, ["tune"]).exit_code == 0 and got["tune"] == TuneConfig()
    text = " ".join(run(app, ["record", "--help"], terminal_width=200).output.split())
    assert "draft tokens per step" in text and "[default: 0.95]" in text
