"""Name -> factory registries (estimators, verify policies, prompt sets): an entry is the factory or a lazy
"package.module:attribute" path imported on first use, so importing the engine pulls in nothing its entries
import; `name in registry`, iteration and the "choose from" error import nothing."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from avkit.errors import ConfigError


class Registry(Mapping[str, Callable[..., Any]]):
    """A mapping of names to factories, each given directly or as a lazy "module:attribute" path."""

    def __init__(self, kind: str, entries: Mapping[str, Callable[..., Any] | str] | None = None):
        self.kind = kind  # what the names name, for the error line ("estimator", "verify policy")
        self._entries: dict[str, Callable[..., Any] | str] = dict(entries or {})

    def __getitem__(self, name: str) -> Callable[..., Any]:
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attribute = entry.partition(":")
            entry = getattr(importlib.import_module(module), attribute)
            self._entries[name] = entry
        return entry

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def register(self, name: str):
        """Decorator: register a factory under `name` (for plug-ins; built-ins are lazy paths)."""
        def deco(factory):
            self._entries[name] = factory
            return factory
        return deco

    def make(self, name: str, **kwargs) -> Any:
        """The factory's product, or one ConfigError naming the unknown name and the choices."""
        if name not in self._entries:
            raise ConfigError(f"unknown {self.kind} {name!r}; choose from {sorted(self._entries)}")
        return self[name](**kwargs)


__all__ = ["Registry"]
