"""What every config shares: the project-wide defaults and `default_of`.

Configs are frozen dataclasses validated once, in their own __post_init__. A command's config is
composed of the narrow configs of the components it drives (`ServeConfig.engine` is an
`EngineConfig`), so a field is declared and validated in exactly one place. The CLI flattens them:
each option's default is `default_of(Cls, "engine.k")`, and the option values are put back into the
nested configs when the command builds its config.
"""

from __future__ import annotations

from dataclasses import MISSING, fields

DEFAULT_K = 7
MAX_K = 64  # the most drafts per request and step anywhere (engine, record, serve, tune, synthetic traces)
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


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


__all__ = ["DEFAULT_DRAFT", "DEFAULT_K", "DEFAULT_TARGET", "MAX_K", "default_of"]
