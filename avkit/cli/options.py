"""What several commands share, each declared once: options (their type and help; the default is the
command's config's, `default_of`), the parsing of a comma-separated list, the console results go to, and how
a command stopped by a signal ends."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from avkit.config import DEFAULT_TRACE_GLOB
from avkit.errors import ConfigError

TargetOption = Annotated[str, typer.Option(help="target model: alias, HF directory or GGUF file")]
DraftOption = Annotated[str, typer.Option(help="draft model ('none' = target-only decoding)")]
DrafterOption = Annotated[str, typer.Option(help="model | hybrid (suffix cache or draft model per step)")]
PayoffOption = Annotated[str, typer.Option(help="hybrid: payoff_mlp.pt (threshold) or payoff_survival.pt (cache and "
                                                "model drafts share one verification budget) from `avkit hvd` "
                                                "(default: ArcticInference's rule)")]
KernelsOption = Annotated[str, typer.Option(help="hot-path kernels: auto (Triton on CUDA, torch elsewhere) | torch | "
                                                 "triton (on a CPU: Triton's interpreter, TRITON_INTERPRET=1)")]
DeviceOption = Annotated[str, typer.Option(help="auto (a GPU if torch sees one) | cpu | cuda[:N]")]
DtypeOption = Annotated[str, typer.Option(help="model dtype: auto (float32 on CPU, bfloat16 on GPU) | float32 | "
                                               "bfloat16 (~3x float32 on AVX512-BF16 CPUs)")]
EngineOption = Annotated[str, typer.Option(help="native (avkit's runtime) | vllm (vLLM's offline engine in its own "
                                                "venv, docs/vllm.md)")]
VllmPythonOption = Annotated[str, typer.Option(help="--engine vllm: that venv's python (default $AVKIT_VLLM_PYTHON, "
                                                    "else .venv-vllm/bin/python)")]
TracesArgument = Annotated[list[Path] | None, typer.Argument(
    metavar="TRACE", help=f"trace files, directories of them or globs (default: the shipped {DEFAULT_TRACE_GLOB})",
    show_default=False)]
CostOption = Annotated[str, typer.Option(help=(
    "a cost file (`avkit profile`, or the model `avkit serve` learned: learned_cost.json; default: the shipped "
    "traces' model pair profiled on a 2-core CPU), or a roofline what-if: roofline:GPU:TARGET, optionally followed "
    "by :DRAFT and :context=N,drafter=parallel"))]
ConcurrencyOption = Annotated[str, typer.Option(help="comma-separated concurrencies (batch sizes)")]


def parse_ints(name: str, text: str) -> tuple[int, ...]:
    """`--concurrency 1,2,4` -> (1, 2, 4); one error line naming the option otherwise."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--{name} must be comma-separated integers, got {text}") from None
    if not values:
        raise ConfigError(f"--{name} is empty")
    return values


def result_table(title: str, columns, rows, left=()) -> Table:
    """A table of text cells for the terminal: the columns named in `left` left-aligned, the others right."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right")
    for row in rows:
        table.add_row(*row)
    return table


def stdout_console(width: int = 132) -> Console:
    """Where a command's result goes: stdout, `width` columns when it is not a terminal (a file, a pipe)."""
    return Console(width=None if sys.stdout.isatty() else width)



def end_process(code: int | str | None) -> NoReturn:
    """Flush stdout, stderr and the log, then exit with `code` (sys.exit's convention) without the interpreter's
    teardown: its last garbage collection walks every object torch and the models left behind, seconds on a busy
    2-core box (4.6 s of a 5 s SIGTERM bound, measured on `avkit serve` with the tiny test models). By the time a
    command returns or unwinds from a signal its outputs are committed or removed (`avkit/staged.py`) and a
    server's side writes are closed, so only the streams and the log need flushing."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to say
            pass
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))
