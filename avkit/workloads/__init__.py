"""Prompt sets by name (docs/workloads.md) or a JSONL file, as `Prompt` lists in a seeded order."""

from __future__ import annotations

import functools
from pathlib import Path

from avkit.errors import ConfigError
from avkit.registry import Registry
from avkit.workloads.base import Prompt, load_jsonl, seeded_order
from avkit.workloads.editing import load_humaneval_edit
from avkit.workloads.sets import SETS, load_set

# name -> loader `fn(seed) -> list[Prompt]`, every prompt of the set (the seed picks humaneval_edit's bugs);
# `WORKLOADS.register(name)` adds one
WORKLOADS = Registry("dataset", {**{name: functools.partial(load_set, name) for name in SETS},
                                 "humaneval_edit": load_humaneval_edit})


def load_workload(name_or_path: str, n: int | None = None, seed: int = 0) -> list[Prompt]:
    """The first `n` prompts (all if None) of a workload or JSONL file, in a seeded order.

    >>> [p.dataset for p in load_workload("humaneval", 2, seed=0)]
    ['humaneval', 'humaneval']
    """
    if n is not None and n < 1:
        raise ConfigError(f"num_prompts must be >= 1, got {n}")
    if name_or_path in WORKLOADS:
        prompts = WORKLOADS[name_or_path](seed)
    elif Path(name_or_path).is_file():
        prompts = load_jsonl(name_or_path)
    else:
        raise ConfigError(f"--dataset {name_or_path}: not a built-in workload ({', '.join(sorted(WORKLOADS))}) "
                          "nor an existing .jsonl file")
    return seeded_order(prompts, seed)[:n]


__all__ = ["WORKLOADS", "Prompt", "load_workload"]
