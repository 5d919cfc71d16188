"""The `avkit` command line: one module per command, each with `register(app)`.

Commands stay thin: parse options, build a config, call the library, render. Any AvkitError
(and any OSError the checks could not foresee, e.g. a disk that fills up) becomes one line on
stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import threading
from typing import Annotated

import typer
from typer.core import TyperGroup

from avkit import __version__
from avkit.cli import conventions
from avkit.errors import AvkitError

COMMANDS = ("models", "record", "datacard", "fit", "hvd", "simulate", "tune", "profile", "serve", "report",
            "import_")


@contextlib.contextmanager
def _one_interrupt():
    """The first SIGINT or SIGTERM interrupts (KeyboardInterrupt: outputs are aborted, nothing half-written
    stays, a kernel build's compiler is stopped); further SIGINTs while that unwinds are ignored, so a burst of
    Ctrl-C never ends in a traceback. Each signal is taken over only where it has its default handler (a
    SIGINT ignored since the shell started us stays ignored); `avkit serve` hands both to uvicorn once its
    port is open."""
    main = threading.current_thread() is threading.main_thread()
    own_int = main and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    own_term = main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    state = {"raised": False}

    def interrupt(signum, frame):
        if not state["raised"]:
            state["raised"] = True
            raise KeyboardInterrupt

    if own_int:
        signal.signal(signal.SIGINT, interrupt)
    if own_term:
        signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:  # once interrupted (here or by a command's own handler, which then ignores SIGINT) the process
        # is ending: later SIGINTs must not break its shutdown. SIGTERM gets its default back (an ignored
        # SIGTERM would be inherited by every child process started later).
        if own_int:
            ending = state["raised"] or signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.signal(signal.SIGINT, signal.SIG_IGN if ending else signal.default_int_handler)
        if own_term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


class _Group(TyperGroup):
    """Every command is looked up here: the conventions (avkit/cli/conventions.py) apply to each."""

    def make_context(self, *args, **kwargs):
        conventions.apply(self, "avkit")  # the group's own options (--version, completion, -h)
        return super().make_context(*args, **kwargs)

    def get_command(self, ctx, cmd_name):
        cmd = super().get_command(ctx, cmd_name)
        return None if cmd is None else conventions.apply(cmd, cmd_name)


class _App(typer.Typer):
    def __call__(self, *args, **kwargs):
        try:
            with _one_interrupt():
                return super().__call__(*args, **kwargs)
        except AvkitError as e:
            print(f"avkit: error: {e}", file=sys.stderr)
            sys.exit(2)
        except OSError as e:  # the disk or the OS refused (full disk, permissions) after the checks passed
            where = f"{e.filename}: " if e.filename else ""
            print(f"avkit: error: {where}{e.strerror or e}", file=sys.stderr)
            sys.exit(2)


app = _App(
    name="avkit",
    cls=_Group,
    help="Adaptive verification for LLM speculative decoding: record, fit, simulate, serve, report.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"avkit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="print the avkit version and exit")] = False) -> None:
    """Adaptive verification for LLM speculative decoding: record, fit, simulate, serve, report."""


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
