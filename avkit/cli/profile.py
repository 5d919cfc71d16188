"""`avkit profile`: measure this device's step costs for the adaptive budget."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from avkit.config import DEFAULT_COST_PATH, DEFAULT_DRAFT, DEFAULT_TARGET, ProfileConfig, default_of


def _d(name: str):
    return default_of(ProfileConfig, name)


def render(table, console: Console) -> None:
    out = Table(title=f"step costs on {table.meta.get('device', '?')} at context {table.meta.get('context_len')}")
    out.add_column("target tokens", justify="right")
    out.add_column("verify ms", justify="right")
    out.add_column("draft requests", justify="right")
    out.add_column("draft ms (1 pass)", justify="right")
    n = max(len(table.verify_tokens), len(table.draft_requests))
    cell = lambda seq, i, fmt: fmt(seq[i]) if i < len(seq) else ""
    for i in range(n):
        out.add_row(cell(table.verify_tokens, i, str), cell(table.verify_ms, i, "{:.2f}".format),
                    cell(table.draft_requests, i, str), cell(table.draft_ms, i, "{:.2f}".format))
    console.print(out)


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile(
        target: Annotated[str, typer.Option(help="target model: alias, HF directory or GGUF file")] = DEFAULT_TARGET,
        draft: Annotated[str, typer.Option(help="draft model ('none': verify costs only)")] = DEFAULT_DRAFT,
        out: Annotated[str, typer.Option(help="cost table JSON (the adaptive policy's default path)")] =
            DEFAULT_COST_PATH,
        context_len: Annotated[int, typer.Option(help="synthetic KV context per request "
                                                      "(AVKIT_PROFILE_CONTEXT_LEN overrides)")] = _d("context_len"),
        k: Annotated[int, typer.Option("-k", "--k", help="draft tokens per request (verify layout)")] = _d("k"),
        max_tokens: Annotated[int, typer.Option(help="largest verify step, target tokens")] = _d("max_tokens"),
        max_requests: Annotated[int, typer.Option(help="largest draft batch, requests")] = _d("max_requests"),
        repeats: Annotated[int, typer.Option(help="timed runs per point (median kept)")] = _d("repeats"),
        temperature: Annotated[float, typer.Option(help="sampling work timed with each forward (0: argmax)")] =
            _d("temperature"),
        top_p: Annotated[float, typer.Option(help="top-p of that sampling work")] = _d("top_p"),
        device: Annotated[str, typer.Option(help="auto (a GPU if torch sees one) | cpu | cuda[:N]")] = "auto",
        dtype: Annotated[str, typer.Option(help="model dtype: auto (float32 on CPU, bfloat16 on GPU) | float32 "
                                                "| bfloat16; profile what you record or serve with")] = "auto",
    ):
        """Profile verify cost by target tokens and draft cost by requests; save a monotone cost table."""
        from avkit.models import load
        from avkit.models.placement import placement
        from avkit.scheduling.profile import num_points, profile_costs
        from avkit.staged import StagedOutputs

        config = ProfileConfig(context_len=context_len, k=k, max_tokens=max_tokens, max_requests=max_requests,
                               repeats=repeats, temperature=temperature, top_p=top_p)
        console = Console(stderr=True)
        dev, dt = placement(device, dtype)
        with StagedOutputs() as outputs:
            outputs.file(out, "--out")  # an unwritable --out fails now, not after minutes of profiling
            tgt = load(target, dtype=dt, device=dev)
            drf = None if draft in ("", "none") else load(draft, dtype=dt, device=dev)
            with Progress(console=console, transient=True) as bar:
                task = bar.add_task("profiling", total=num_points(config, drf is not None))
                table = profile_costs(tgt, drf, config, on_point=lambda: bar.advance(task))
            render(table, console)
            path = table.save(out, outputs)
        console.print(f"cost table: {path}")
