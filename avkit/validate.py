"""Shared validators for the public boundary: every message names the argument and shows the bad value."""

from __future__ import annotations

import math

from avkit.errors import ConfigError


def shown(value) -> str:
    """A value as the user typed it: -4 (not -4.0), 1,2,4 (not (1, 2, 4)), foo (not 'foo'); '' when empty."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return ",".join(v if isinstance(v, str) else shown(v) for v in value)
    return str(value) if str(value) else "''"


def check_range(name: str, value, lo=None, hi=None, *, lo_open=False, hi_open=False):
    """Raise ConfigError unless lo <= value <= hi (open ends where asked); return value.

    The message names `name` and shows the value as typed: "--concurrency must be >= 1, got -4"."""
    bad = value is None or (isinstance(value, float) and math.isnan(value))
    if not bad and lo is not None:
        bad = value <= lo if lo_open else value < lo
    if not bad and hi is not None:
        bad = value >= hi if hi_open else value > hi
    if bad:
        if hi is None:
            rule = f"{'>' if lo_open else '>='} {shown(lo)}"
        elif lo is None:
            rule = f"{'<' if hi_open else '<='} {shown(hi)}"
        else:
            rule = f"in {'(' if lo_open else '['}{shown(lo)}, {shown(hi)}{')' if hi_open else ']'}"
        raise ConfigError(f"{name} must be {rule}, got {shown(value)}")
    return value


def check_choice(name: str, value, choices):
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(map(str, choices))}; got {shown(value)}")
    return value


def option(name: str) -> str:
    """A config field as the command line spells it (field names are option names): -k, --max-new-tokens."""
    return ("-" if len(name) == 1 else "--") + name.replace("_", "-")


def option_text(name: str, value) -> str:
    """A config field and its value as a command line spells them: `--concurrency 1,4`, `--no-draft-gate`."""
    flag = option(name)
    if isinstance(value, bool):
        return flag if value else "--no-" + flag.lstrip("-")
    return f"{flag} {','.join(map(str, value)) if isinstance(value, list | tuple) else value}"


def in_range(config, name: str, lo=None, hi=None, **ends):
    """check_range on one field of a config, named as its option."""
    return check_range(option(name), getattr(config, name), lo, hi, **ends)


DEVICES = ("auto", "cpu", "cuda")  # "cuda:N" also accepted
DTYPES = ("auto", "float32", "bfloat16")


def check_placement(device: str, dtype: str) -> tuple[str, str]:
    """Validate a model placement by name (no torch import): device auto|cpu|cuda|cuda:N, dtype auto|float32|bfloat16."""
    head, _, index = str(device).partition(":")
    if head not in DEVICES or (index and (head != "cuda" or not index.isdigit())):
        raise ConfigError(f"--device must be one of {', '.join(DEVICES)} or cuda:N; got {shown(device)}")
    check_choice("--dtype", dtype, DTYPES)
    return device, dtype
