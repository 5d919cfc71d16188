"""`avkit serve`: the OpenAI-compatible server with budgeted verification and online refits."""

from __future__ import annotations

from typing import Annotated

import typer
from typer._click.core import ParameterSource  # typer >= 0.29 carries its own click

from avkit.cli.options import arg, config_options, end_process, make
from avkit.config import ServeConfig, default_of
from avkit.errors import ConfigError
from avkit.scheduling.spec import ADAPTIVE, parse_spec
from avkit.validate import option, shown


def policy_fields(ctx: typer.Context, policy: str, spec, values: dict) -> dict:
    """`values` (by field path) with the one field `--policy` (as typed) sets by its argument: --estimator from
    adaptive:E, -k from fixed:K or nospec, --schedule from schedule:FILE. A field has one value, never a silent
    winner: that option typed too with another value is a ConfigError naming both as typed."""
    path = "adaptive.estimator" if spec.name in ADAPTIVE else {"fixed": "engine.k", "schedule": "schedule"}.get(
        spec.name)
    if not (path and spec.arg):
        return values
    field = path.rpartition(".")[2]
    value = int(spec.arg) if field == "k" else spec.arg
    if ctx.get_parameter_source(field) != ParameterSource.DEFAULT and values[path] != value:
        raise ConfigError(f"--policy {policy} sets {option(field)} {shown(value)}, but {option(field)} "
                          f"{shown(values[path])} is given too: give one of them, or the same value")
    return values | {path: value}


def register(app: typer.Typer) -> None:
    @app.command("serve")
    @config_options(
        ServeConfig, arg("ctx", typer.Context), "models.target", "models.draft", "models.drafter", "models.payoff",
        "policy", "schedule", "adaptive.estimator", "online.refit_interval", "adaptive.coefficients",
        "adaptive.cache_coefficients", "adaptive.cost", "snapshot", "snapshot_every", "resume", "record",
        "http.host", "http.port", "http.api_key", "http.served_model_name", "engine.concurrency", "http.queue_size",
        "engine.max_len", "max_new_tokens", "engine.k", "engine.seed", "models.device", "models.dtype",
        "engine.kernels", "http.grace_period", "http.max_body_bytes", "http.log_requests",
        arg("log_level", Annotated[str, typer.Option(help="log level (uvicorn and avkit)")], "info"),
        help={"concurrency": "requests decoding at once, at most", "refit_interval": "engine steps per online refit"},
        build=False)
    def serve(values: dict, ctx: typer.Context, log_level: str):
        """Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics."""
        spec = parse_spec(values["policy"], bare=("fixed", "schedule"), estimator=values["adaptive.estimator"])
        values = policy_fields(ctx, values["policy"], spec, values)  # simulate's syntax
        config = make(ServeConfig, values | {  # every option's own bound is checked here, before torch
            "policy": spec.name, "adaptive.draft_gate": spec.gate,
            "default_max_tokens": min(default_of(ServeConfig, "default_max_tokens"), values["max_new_tokens"])})
        from avkit.serve.server import serve as run  # lazy: start-up

        if run(config, log_level=log_level):  # stopped by SIGTERM/SIGINT, everything closed
            end_process(0)
