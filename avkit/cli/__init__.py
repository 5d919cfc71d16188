"""The `avkit` command line: one module per command, each with `register(app)`.

Commands stay thin: parse options, build a config, call the library, render. A command imports the library
in its body (`# lazy: start-up`), so `avkit --version` and every `-h` stay under 1 s. Any AvkitError
(and any OSError the checks could not foresee, e.g. a disk that fills up) becomes one line on
stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer
from typer._click import exceptions as click  # typer >= 0.29 carries its own click
from typer.core import TyperGroup

from avkit import __version__
from avkit.cli.options import end_process
from avkit.errors import AvkitError
from avkit.staged import one_interrupt

COMMANDS = ("models", "record", "datacard", "fit", "hvd", "simulate", "tune", "profile", "serve", "report",
            "import_")


def _plain_help(cmd):
    """Help that shows what each option takes: a flag nothing, an argument its name, others INT/FLOAT/PATH/TEXT
    (typer would print Python types). Idempotent; a group's commands get it too."""
    if getattr(cmd, "_avkit_help", False):
        return cmd
    for sub in getattr(cmd, "commands", {}).values():
        _plain_help(sub)
    for p in cmd.params:
        if getattr(p, "is_flag", False):
            p.metavar = ""
        elif getattr(p, "param_type_name", "") == "argument":
            p.display_type_rich = lambda ctx: None
        elif p.metavar is None and hasattr(p, "type_descriptor"):  # typer's record of the annotation
            kind = p.type_descriptor
            p.metavar = "PATH" if kind.is_path else {int: "INT", float: "FLOAT"}.get(kind.annotation, "TEXT")
    make = cmd.get_help_option

    def get_help_option(ctx):  # -h/--help is made per context: a flag too
        option = make(ctx)
        if option is not None:
            option.metavar = ""
        return option
    cmd.get_help_option = get_help_option
    cmd._avkit_help = True
    return cmd


class _Group(TyperGroup):
    """Every command is looked up here, so `avkit ...` and typer's CliRunner show the same help."""

    def make_context(self, *args, **kwargs):
        _plain_help(self)  # the group's own options (--version, completion, -h)
        return super().make_context(*args, **kwargs)

    def get_command(self, ctx, cmd_name):
        cmd = super().get_command(ctx, cmd_name)
        return None if cmd is None else _plain_help(cmd)


def _as_typed(argv: list[str], names: list[str]) -> str | None:
    """The value the user gave an option on the command line (`--bins abc` or `--bins=abc`), if any."""
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
        head, eq, value = arg.partition("=")
        if eq and head in names:
            return value
    return None


def _error_line(e: Exception, argv: list[str]) -> str:
    """The one `avkit: error:` line: an AvkitError as raised; click's complaint in one line (a value that is not a
    number names the option and the value as typed); an OSError the checks could not foresee (full disk,
    permissions) with its file."""
    if isinstance(e, OSError):
        return (f"{e.filename}: " if e.filename else "") + str(e.strerror or e)
    if not isinstance(e, click.UsageError):
        return str(e)
    param = getattr(e, "param", None)
    if isinstance(e, click.BadParameter) and param is not None and param.param_type_name == "option":
        kind = {"INT": "an integer", "FLOAT": "a number"}.get(param.metavar)
        value = _as_typed(argv, param.opts + param.secondary_opts)
        if kind and value is not None:
            return f"{max(param.opts, key=len)} must be {kind}, got {value}"
    return " ".join(e.format_message().split())


class _App(typer.Typer):
    """Any bad input (click's usage errors included) becomes one `avkit: error:` line and exit code 2."""

    def __call__(self, args=None, **kwargs):
        kwargs.pop("standalone_mode", None)  # always: errors are handled here, whatever the caller asks
        with one_interrupt() as signalled:
            try:
                sys.exit(self._run(list(sys.argv[1:] if args is None else args), **kwargs))
            except SystemExit as e:
                if signalled():  # a signal stopped the command: its outputs are committed or removed by now
                    end_process(e.code)
                raise

    def _run(self, argv: list[str], **kwargs) -> int:
        try:
            code = super().__call__(argv, standalone_mode=False, **kwargs)
        except click.NoArgsIsHelpError as e:  # `avkit models`: its help (typer's rich help prints itself)
            if text := e.ctx.get_help():
                print(text)
            return 2
        except typer.Abort:
            print("Aborted!", file=sys.stderr)
            return 1
        except (click.UsageError, AvkitError, OSError) as e:  # OSError: after the checks passed
            print(f"avkit: error: {_error_line(e, argv)}", file=sys.stderr)
            return 2
        return code if isinstance(code, int) else 0


app = _App(
    name="avkit",
    cls=_Group,
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
    importlib.import_module(f"avkit.cli.{_name}").register(app)


def main() -> None:
    app()
