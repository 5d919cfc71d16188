"""What every config shares: the project-wide defaults, `default_of`, and the field checks.

Configs are frozen dataclasses validated once, in their own __post_init__. A command's config is
composed of the narrow configs of the components it drives (`ServeConfig.engine` is an
`EngineConfig`), so a field is declared and validated in exactly one place. The CLI flattens them:
each option's default is `default_of(Cls, "engine.k")`, and the option values are put back into the
nested configs when the command builds its config. A field's bound is declared with the field
(`checked(8, 1)`: >= 1; `checked("auto", choices=...)`) and `Checked.__post_init__` checks them all,
in declaration order, naming each field as its option; rules between fields stay in the subclass.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

from avkit.validate import check_choice, check_range, option

DEFAULT_K = 7
MAX_K = 64  # the most drafts per request and step anywhere (engine, record, serve, tune, synthetic traces)
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


def checked(default, lo=None, hi=None, *, choices=None, lo_open: bool = False, hi_open: bool = False):
    """A field with its bound: lo <= value <= hi (open ends where asked), or a value among `choices`."""
    return field(default=default, metadata={"check": (lo, hi, choices, lo_open, hi_open)})


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
    for f in fields(cls):
        if f.name != head:
            continue
        if f.default is not MISSING:
            value = f.default
        elif f.default_factory is not MISSING:  # type: ignore[misc]
            value = f.default_factory()  # type: ignore[misc]
        else:
            break
        for part in path:
            value = getattr(value, part)
        return value
    raise KeyError(name)


__all__ = ["DEFAULT_DRAFT", "DEFAULT_K", "DEFAULT_TARGET", "MAX_K", "Checked", "checked", "default_of"]
