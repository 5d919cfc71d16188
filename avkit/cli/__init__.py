"""The `avkit` command line: one module per command, each with `register(app)`.

Commands stay thin: parse options, build a config, call the library, render. Any AvkitError
becomes one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import sys

import typer

from avkit.errors import AvkitError

COMMANDS = ("models", "record", "fit", "hvd", "simulate", "tune", "profile", "serve", "report")


class _App(typer.Typer):
    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except AvkitError as e:
            print(f"avkit: error: {e}", file=sys.stderr)
            sys.exit(2)


app = _App(
    name="avkit",
    help="Adaptive verification for LLM speculative decoding: record, fit, simulate, serve, report.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for _name in COMMANDS:
    try:
        _mod = importlib.import_module(f"avkit.cli.{_name}")
    except ModuleNotFoundError as _e:  # a command whose module is not written yet
        if _e.name == f"avkit.cli.{_name}":
            continue
        raise
    _mod.register(app)


def main() -> None:
    app()
