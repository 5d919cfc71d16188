"""What the commands share: options built from config fields (`config_options`: a field is its option, named,
defaulted, helped and checked once in avkit/config/), the comma-separated lists, the console results go to, and
how a command stopped by a signal ends."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import typing
from dataclasses import fields, replace
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from avkit.config import DEFAULT_TRACE_GLOB, default_of
from avkit.errors import ConfigError


def parse_ints(name: str, text: str) -> tuple[int, ...]:
    """`--concurrency 1,2,4` -> (1, 2, 4); one error line naming the option otherwise."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--{name} must be comma-separated integers, got {text}") from None
    if not values:
        raise ConfigError(f"--{name} is empty")
    return values


_hints = functools.cache(typing.get_type_hints)  # a config's resolved field types, read once per class


def _field(cls, path: str):
    """(the dataclass Field at dotted `path`, its resolved type)."""
    head, _, rest = path.partition(".")
    f = next(f for f in fields(cls) if f.name == head)
    kind = _hints(cls)[head]
    return _field(kind, rest) if rest else (f, kind)


def _option(cls, path: str, help: str | None):
    """-> (the typer parameter of the field at `path`, its default, the parser from the option's value to the
    field's). A tuple field is a comma-separated list (`repeat`: a repeatable option); `flags` and the other
    typer settings come from the field's metadata."""
    f, kind = _field(cls, path)
    cli = dict(f.metadata.get("cli", {}))
    flags, repeat = cli.pop("flags", ()), cli.pop("repeat", False)
    name, default = path.rpartition(".")[2], default_of(cls, path)
    parse = lambda v: v
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        if repeat:
            kind, parse, default = list[item] | None, lambda v, d=default: tuple(v) if v else d, None
        elif item is int:
            kind, default = str, ",".join(map(str, default))
            parse = lambda v, n=name.replace("_", "-"): parse_ints(n, v) if v or default_of(cls, path) else ()
        else:
            kind, default = str, ",".join(default)
            parse = lambda v: tuple(s.strip() for s in v.split(",")) if v else ()
    return Annotated[kind, typer.Option(*flags, help=help or f.metadata["help"], **cli)], default, parse


def config_options(classes, *entries, help: dict[str, str] | None = None, build: bool = True):
    """A command whose options are config fields: `entries` in option order, each a dotted field path of the
    first of `classes` that has it, or an `inspect.Parameter` of the command's own (an argument, a flag no
    config holds); `help` overrides a field's help for this command. The command is called with one config per
    class, built from the options (or, with `build=False`, with their values by path), and its own parameters."""
    classes = classes if isinstance(classes, tuple) else (classes,)
    help = help or {}

    def decorate(fn):
        params, parsers = [], {}
        for e in entries:
            if isinstance(e, inspect.Parameter):
                params.append(e)
                continue
            cls = next(c for c in classes if any(f.name == e.partition(".")[0] for f in fields(c)))
            name = e.rpartition(".")[2]
            annotation, default, parse = _option(cls, e, help.get(name))
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=annotation))
            parsers[name] = (cls, e, parse)

        def command(**kw):
            values = {c: {} for c in classes}
            for name, (cls, path, parse) in parsers.items():
                values[cls][path] = parse(kw.pop(name))
            if not build:
                return fn(*values.values(), **kw)
            return fn(*(make(cls, v) for cls, v in values.items()), **kw)
        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        command.__name__, command.__doc__ = fn.__name__, fn.__doc__
        return command
    return decorate


def make(cls, values: dict):
    """`cls` from values by dotted field path (`{"models.target": ...}`): nested configs built first, the rest
    at their defaults."""
    nested: dict[str, dict] = {}
    top = {}
    for path, value in values.items():
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            top[head] = value
    for head, sub in nested.items():  # one level: a nested config's options are its own fields
        top[head] = replace(default_of(cls, head), **sub)
    return cls(**top)


def arg(name: str, annotation, default=inspect.Parameter.empty) -> inspect.Parameter:
    """A command's own parameter, for `config_options`."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def traces_arg(help: str = "", name: str = "traces", metavar: str = "TRACE") -> inspect.Parameter:
    """A command's TRACE arguments (None when none is given), for `config_options`."""
    help = help or f"trace files, directories of them or globs (default: the shipped {DEFAULT_TRACE_GLOB})"
    return arg(name, Annotated[list[Path] | None, typer.Argument(metavar=metavar, help=help, show_default=False)],
               None)


def result_table(title: str, columns, rows, left=(), no_wrap: bool = False) -> Table:
    """A table of text cells for the terminal: the columns named in `left` left-aligned, the others right."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right", no_wrap=no_wrap)
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
