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

import typer

from avkit.errors import AvkitError

COMMANDS = ("models", "record", "fit", "hvd", "simulate", "tune", "profile", "serve", "report")


@contextlib.contextmanager
def _one_interrupt():
    """The first SIGINT interrupts (KeyboardInterrupt: outputs are aborted, nothing half-written stays);
    further ones while that unwinds are ignored, so a burst of Ctrl-C never ends in a traceback."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    state = {"raised": False}

    def interrupt(signum, frame):
        if not state["raised"]:
            state["raised"] = True
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:  # once interrupted the process is ending: later signals must not break its shutdown
        signal.signal(signal.SIGINT, signal.SIG_IGN if state["raised"] else signal.default_int_handler)


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
