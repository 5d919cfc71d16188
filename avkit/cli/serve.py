"""`avkit serve`: the OpenAI-compatible server with budgeted verification and online refits."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from avkit.config import ServeConfig, default_of


def _d(name: str):
    return default_of(ServeConfig, name)


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        target: Annotated[str, typer.Option(help="target model: alias, HF directory or GGUF file")] = _d("target"),
        draft: Annotated[str, typer.Option(help="draft model ('none' = target-only decoding)")] = _d("draft"),
        drafter: Annotated[str, typer.Option(help="drafter: model | hybrid")] = _d("drafter"),
        policy: Annotated[str, typer.Option(help="verify policy: adaptive | full | fixed")] = _d("policy"),
        coefficients: Annotated[str, typer.Option(help="deployed coefficients.json (warm start)")] =
            _d("coefficients"),
        cost: Annotated[str, typer.Option(help="cost table JSON from `avkit profile`")] = _d("cost"),
        snapshot: Annotated[str, typer.Option(help="live coefficient snapshot file "
                                              "(default ~/.cache/avkit/serve/coefficients.json)")] = _d("snapshot"),
        snapshot_every: Annotated[int, typer.Option(help="snapshot every M refits")] = _d("snapshot_every"),
        resume: Annotated[bool, typer.Option(help="warm-start from the snapshot when it exists")] = _d("resume"),
        record: Annotated[str, typer.Option(help="stream per-draft trace rows to this Parquet file")] =
            _d("record"),
        host: Annotated[str, typer.Option(help="bind address (loopback by default)")] = _d("host"),
        port: Annotated[int, typer.Option(help="TCP port")] = _d("port"),
        api_key: Annotated[str, typer.Option(help="require `Authorization: Bearer KEY`", envvar="AVKIT_API_KEY")]
            = _d("api_key"),
        served_model_name: Annotated[str, typer.Option(help="model name clients use (default: target id)")] =
            _d("served_model_name"),
        max_concurrency: Annotated[int, typer.Option(help="requests decoding at once")] = _d("max_concurrency"),
        queue_size: Annotated[int, typer.Option(help="requests waiting before 429")] = _d("queue_size"),
        max_len: Annotated[int, typer.Option(help="context limit in tokens")] = _d("max_len"),
        max_tokens_limit: Annotated[int, typer.Option(help="largest max_tokens accepted")] =
            _d("max_tokens_limit"),
        k: Annotated[int, typer.Option(help="draft tokens per step")] = _d("k"),
        seed: Annotated[int, typer.Option(help="engine seed")] = _d("seed"),
        grace_period: Annotated[float, typer.Option(help="seconds to finish in-flight requests on SIGTERM")] =
            _d("grace_period_s"),
        log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
    ):
        """Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics."""
        from avkit.serve.server import bind_warning, serve as run

        config = ServeConfig(
            target=target, draft=draft, drafter=drafter, policy=policy, coefficients=coefficients, cost=cost,
            snapshot=snapshot, snapshot_every=snapshot_every, resume=resume, record=record, host=host,
            port=port, api_key=api_key, served_model_name=served_model_name, max_concurrency=max_concurrency,
            queue_size=queue_size, max_len=max_len, max_tokens_limit=max_tokens_limit,
            default_max_tokens=min(_d("default_max_tokens"), max_tokens_limit), k=k, seed=seed,
            grace_period_s=grace_period)
        console = Console(stderr=True)
        warning = bind_warning(config)
        if warning:
            console.print(f"[bold yellow]warning:[/] {warning}")
        console.print(f"avkit serve: loading {config.target}" + (f" + {config.draft}" if config.draft else ""))
        run(config, log_level=log_level)
