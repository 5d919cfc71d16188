"""``avkit datacard``: the data card of recorded traces (settings, counts, acceptance), from the files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("datacard")(datacard)


def datacard(
        traces: Annotated[list[Path], typer.Argument(help="trace files (generations tables beside them are skipped)")],
        out: Annotated[Path | None, typer.Option(
            help="card to update between its BEGIN/END markers (a new file: the tables alone); default: print")] = None,
) -> None:
    """Recompute the data card's tables from the trace files, so the card cannot drift from the data."""
    from avkit.record.datacard import write_datacard  # lazy: pyarrow

    text = write_datacard(traces, out)
    if out is None:
        print(text)
