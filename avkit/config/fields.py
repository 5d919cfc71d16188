"""What every config shares: the project-wide defaults, the shipped files, `default_of` and the field checks.

A field's bound and its option's help are declared with the field (`checked(8, 1, help=...)`: >= 1;
`checked("auto", choices=...)`) and `Checked.__post_init__` checks them all, in declaration order, naming each
field as its option; rules between fields stay in the subclass.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from avkit.validate import check_choice, check_range, option

DEFAULT_K = 7
MAX_K = 64  # the most drafts per request and step anywhere (engine, record, serve, tune, synthetic traces)
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"

# the files shipped with avkit, found under the working directory, else beside the package (a clone)
DEFAULT_TRACE_GLOB = "traces/*.parquet"  # the shipped traces every command uses with no TRACE argument
SHIPPED_COEFFICIENTS = "traces/coefficients.json"  # fitted on the shipped traces
# `avkit profile` of the traces' model pair on a 2-core CPU (Xeon with AMX, bfloat16, T = 1, context 512): the
# default cost model of `avkit simulate`, `tune` and `report`; a roofline (e.g. roofline:H200:8b) is a what-if
SHIPPED_COST = "traces/cost_cpu.json"


def shipped_roots() -> tuple[Path, Path]:
    """Where shipped files are looked for, in order: the working directory, then beside the package."""
    return Path.cwd(), Path(__file__).resolve().parents[2]


def shipped_file(name: str) -> Path | None:
    """The shipped file `name` (repo-relative) under the first root that has it; None when none does."""
    return next((root / name for root in shipped_roots() if (root / name).is_file()), None)


def checked(default, lo=None, hi=None, *, choices=None, lo_open: bool = False, hi_open: bool = False,
            help: str = "", **cli):
    """A field with its bound (lo <= value <= hi, open ends where asked, or a value among `choices`; none: not
    checked) and its option: `help`, and in `cli` the typer.Option settings (`flags`, `metavar`, ...) and
    `repeat` (a tuple given as a repeated option, not a comma-separated list; avkit/cli/options.py)."""
    check = None if lo is None and hi is None and choices is None else (lo, hi, choices, lo_open, hi_open)
    return field(default=default, metadata={"check": check, "help": help, "cli": cli})


@dataclass(frozen=True)
class Checked:
    """Base of every config: checks each `checked` field; "--concurrency must be >= 1, got -4"."""

    def __post_init__(self):
        for f in fields(self):
            if (spec := f.metadata.get("check")) is None:
                continue
            lo, hi, choices, lo_open, hi_open = spec
            value = getattr(self, f.name)
            if choices is not None:
                check_choice(option(f.name), value, choices)
            else:
                check_range(option(f.name), value, lo, hi, lo_open=lo_open, hi_open=hi_open)


def default_of(cls, name: str):
    """The dataclass default of one field; a dotted name ("engine.k") reads it from the default of the
    nested config (so a command that composes a narrow config with other defaults gets its own)."""
    head, *path = name.split(".")
    f = next((f for f in fields(cls) if f.name == head), None)
    if f is None or (f.default is MISSING and f.default_factory is MISSING):
        raise KeyError(name)
    value = f.default if f.default is not MISSING else f.default_factory()
    for part in path:
        value = getattr(value, part)
    return value
