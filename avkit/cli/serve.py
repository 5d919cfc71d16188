"""`avkit serve`: the OpenAI-compatible server with budgeted verification and online refits."""

from __future__ import annotations

import functools
from typing import Annotated

import typer
from rich.console import Console
from typer._click.core import ParameterSource  # typer >= 0.29 carries its own click

from avkit.cli.options import (
    DeviceOption, DraftOption, DrafterOption, DtypeOption, KernelsOption, PayoffOption, TargetOption, end_process)
from avkit.config import (
    AdaptiveConfig, EngineConfig, EstimatorConfig, HttpConfig, ModelsConfig, ServeConfig, default_of)
from avkit.errors import ConfigError
from avkit.scheduling.spec import ADAPTIVE, parse_spec
from avkit.validate import option, shown


_d = functools.partial(default_of, ServeConfig)  # an option's default: its config field's


def _o(help: str, **kw):
    return typer.Option(help=help, **kw)


def policy_fields(ctx: typer.Context, policy: str, spec, options: dict) -> dict:
    """`options` (estimator, k, schedule) with the one `--policy` (as typed) sets by its argument: estimator from
    adaptive:E, k from fixed:K or nospec, schedule from schedule:FILE. A field has one value, never a silent
    winner: that option typed too with another value is a ConfigError naming both as typed."""
    field = "estimator" if spec.name in ADAPTIVE else {"fixed": "k", "schedule": "schedule"}.get(spec.name)
    if not (field and spec.arg):
        return options
    value = int(spec.arg) if field == "k" else spec.arg
    if ctx.get_parameter_source(field) != ParameterSource.DEFAULT and options[field] != value:
        raise ConfigError(f"--policy {policy} sets {option(field)} {shown(value)}, but {option(field)} "
                          f"{shown(options[field])} is given too: give one of them, or the same value")
    return options | {field: value}


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        ctx: typer.Context,
        target: TargetOption = _d("models.target"),
        draft: DraftOption = _d("models.draft"),
        drafter: DrafterOption = _d("models.drafter"),
        payoff: PayoffOption = _d("models.payoff"),
        policy: Annotated[str, _o("verify policy in simulate's --policy syntax: adaptive-stop[-nogate][:ESTIMATOR] "
                                  "(also stops drafting early; -nogate: never skips drafting a step) | "
                                  "adaptive[-nogate][:ESTIMATOR] | full | nospec | "
                                  "fixed[:K] (bare: -k) | schedule[:FILE] (K by batch size; bare: --schedule)")] =
            _d("policy"),
        schedule: Annotated[str, _o("--policy schedule: `avkit tune` results JSON or its --format vllm "
                                    "fragment")] = _d("schedule"),
        estimator: Annotated[str, _o("adaptive policy's estimator (registry name)")] = _d("adaptive.estimator"),
        refit_interval: Annotated[int, _o("engine steps per online refit")] = _d("online.refit_interval"),
        coefficients: Annotated[str, _o("deployed coefficients.json (warm start; wins over an existing "
                                        "snapshot)")] = _d("adaptive.coefficients"),
        cache_coefficients: Annotated[str, _o("hybrid drafter: coefficients.json for the suffix cache's rows, fitted "
                                              "on them (`avkit fit --drafter suffix`); default: their own estimator "
                                              "from the reference constants")] = _d("adaptive.cache_coefficients"),
        cost: Annotated[str, _o("cost table JSON from `avkit profile`, or roofline:GPU:MODEL")] = _d("adaptive.cost"),
        snapshot: Annotated[str, _o("live coefficient snapshot (default "
                                    "~/.cache/avkit/serve/coefficients.json)")] = _d("snapshot"),
        snapshot_every: Annotated[int, _o("snapshot every M refits")] = _d("snapshot_every"),
        resume: Annotated[bool, _o("warm-start from the snapshot when it exists (and no --coefficients)")] =
            _d("resume"),
        record: Annotated[str, _o("stream per-draft trace rows to this Parquet file")] = _d("record"),
        host: Annotated[str, _o("bind address (loopback by default)")] = _d("http.host"),
        port: Annotated[int, _o("TCP port")] = _d("http.port"),
        api_key: Annotated[str, _o("require `Authorization: Bearer KEY`; prefer the AVKIT_API_KEY environment "
                                   "variable: a key on the command line is visible to every user in `ps`",
                                   envvar="AVKIT_API_KEY", show_default=False)] = _d("http.api_key"),
        served_model_name: Annotated[str, _o("model name clients use (default: the target id)")] =
            _d("http.served_model_name"),
        concurrency: Annotated[int, _o("requests decoding at once, at most")] = _d("engine.concurrency"),
        queue_size: Annotated[int, _o("requests waiting beyond those before 429")] = _d("http.queue_size"),
        max_len: Annotated[int, _o("context limit in tokens")] = _d("engine.max_len"),
        max_new_tokens: Annotated[int, _o("largest max_tokens a request may ask (new tokens per request)")] =
            _d("max_new_tokens"),
        k: Annotated[int, typer.Option("-k", "--k", help="draft tokens per step")] = _d("engine.k"),
        seed: Annotated[int, _o("engine seed")] = _d("engine.seed"),
        device: DeviceOption = _d("models.device"),
        dtype: DtypeOption = _d("models.dtype"),
        kernels: KernelsOption = _d("engine.kernels"),
        grace_period: Annotated[float, _o("seconds to finish in-flight requests on SIGTERM")] =
            _d("http.grace_period"),
        max_body_bytes: Annotated[int, _o("largest request body in bytes (413 beyond)")] = _d("http.max_body_bytes"),
        log_requests: Annotated[bool, _o("one access-log line per request: method, path, status, tokens, "
                                         "seconds")] = _d("http.log_requests"),
        log_level: Annotated[str, _o("log level (uvicorn and avkit)")] = "info",
    ):
        """Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics."""
        spec = parse_spec(policy, bare=("fixed", "schedule"), estimator=estimator)  # simulate's syntax
        fields = policy_fields(ctx, policy, spec, {"estimator": estimator, "k": k, "schedule": schedule})
        config = ServeConfig(  # every option's own bound is checked here, before torch
            models=ModelsConfig(target=target, draft=draft, drafter=drafter, payoff=payoff, device=device,
                                dtype=dtype),
            engine=EngineConfig(k=fields["k"], concurrency=concurrency, max_len=max_len, seed=seed,
                                kernels=kernels),
            online=EstimatorConfig(refit_interval=refit_interval),
            adaptive=AdaptiveConfig(estimator=fields["estimator"], coefficients=coefficients, cost=cost,
                                    cache_coefficients=cache_coefficients, draft_gate=spec.gate),
            http=HttpConfig(host=host, port=port, api_key=api_key, served_model_name=served_model_name,
                            queue_size=queue_size, grace_period=grace_period, max_body_bytes=max_body_bytes,
                            log_requests=log_requests),
            policy=spec.name, schedule=fields["schedule"], snapshot=snapshot, snapshot_every=snapshot_every,
            resume=resume, record=record, max_new_tokens=max_new_tokens,
            default_max_tokens=min(_d("default_max_tokens"), max_new_tokens))
        from avkit.serve.server import bind_warning, serve as run  # lazy: start-up (the library loads when the command runs: -h stays fast)
        from avkit.serve.startup import bind_socket, check_record_writable, warm_start  # lazy: start-up (the library loads when the command runs: -h stays fast)

        # Everything that can be wrong with the options fails here, as one line, before the models load.
        warm_start(config)
        if config.policy == "schedule":
            from avkit.scheduling.batch_schedule import make_scheduled  # lazy: start-up (the library loads when the command runs: -h stays fast)

            make_scheduled(config.schedule, k=config.engine.k)
        if config.record:
            check_record_writable(config.record)
        sock = bind_socket(config.http.host, config.http.port)
        console = Console(stderr=True)
        warning = bind_warning(config)
        if warning:
            console.print(f"[bold yellow]warning:[/] {warning}")
        draft_note = f" + {config.models.draft}" if config.models.has_draft else ""
        console.print(f"avkit serve: loading {config.models.target}{draft_note}")
        if run(config, log_level=log_level, sock=sock):  # stopped by SIGTERM/SIGINT, everything closed
            end_process(0)
