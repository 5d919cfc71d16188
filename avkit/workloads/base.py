"""Prompt sets as data: the `Prompt` record and the `WORKLOADS` registry.

Glossary:
  prompt     one conversation start: chat messages (or raw text), optional tool schemas, and
             follow-up user turns asked after the model's own answer (MT-Bench's second turn)
  workload   a named loader `fn(seed) -> list[Prompt]` returning every prompt of the set
             in a seeded order; `load_workload` (avkit/workloads/__init__.py) takes the first n
Loaders register with `@register("name")`; a JSONL file path is accepted wherever a name is.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from avkit.errors import ConfigError


@dataclass(frozen=True)
class Prompt:
    """One prompt of a workload."""

    dataset: str  # workload name, e.g. "humaneval"
    prompt_id: str  # identifier within the dataset, e.g. "HumanEval/0"
    messages: tuple[dict, ...] = ()  # chat messages [{"role", "content"}]; empty for raw text
    text: str | None = None  # raw completion text (used when messages is empty)
    tools: tuple[dict, ...] | None = None  # OpenAI-style tool schemas, rendered by the chat template
    followups: tuple[str, ...] = ()  # user turns appended after each model answer

    def __post_init__(self):
        if not self.messages and not self.text:
            raise ConfigError(f"prompt {self.dataset}/{self.prompt_id}: needs messages or text")


Loader = Callable[[int], list[Prompt]]  # seed -> every prompt of the set, in a seeded order
WORKLOADS: dict[str, Loader] = {}


def register(name: str):
    """Decorator adding a loader to `WORKLOADS` under `name`."""

    def wrap(fn: Loader) -> Loader:
        WORKLOADS[name] = fn
        return fn

    return wrap


def seeded_order(items: list, seed: int) -> list:
    """A seeded permutation of `items` (stable across runs and platforms)."""
    order = list(items)
    random.Random(seed).shuffle(order)
    return order
