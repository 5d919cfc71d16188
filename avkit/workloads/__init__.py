"""Prompt sets by name (docs/workloads.md) or a JSONL file, as `Prompt` lists in a seeded order."""

from __future__ import annotations

from pathlib import Path

from avkit.errors import ConfigError
from avkit.registry import Registry
from avkit.workloads.base import Prompt, load_jsonl, seeded_order

# name -> loader `fn(seed) -> list[Prompt]`, every prompt of the set (the seed picks humaneval_edit's bugs),
# imported on first use; `WORKLOADS.register(name)` adds one
WORKLOADS = Registry("dataset", {
    **{name: f"avkit.workloads.sets:load_{name}" for name in ("humaneval", "mtbench", "mtbench_revise", "sharegpt",
                                                              "sharegpt_multiround", "bfcl", "bfcl_multiturn")},
    "humaneval_edit": "avkit.workloads.editing:load_humaneval_edit"})


def load_workload(name_or_path: str, n: int | None = None, seed: int = 0) -> list[Prompt]:
    """The first `n` prompts (all if None) of a workload or JSONL file, in a seeded order.

    >>> [p.dataset for p in load_workload("humaneval", 2, seed=0)]
    ['humaneval', 'humaneval']
    """
    if n is not None and n < 1:
        raise ConfigError(f"num_prompts must be >= 1, got {n}")
    if name_or_path in WORKLOADS:
        prompts = WORKLOADS[name_or_path](seed)
    elif name_or_path.endswith(".jsonl") or Path(name_or_path).is_file():
        prompts = load_jsonl(name_or_path)
    else:
        raise ConfigError(f"unknown dataset {name_or_path!r}: choose from {sorted(WORKLOADS)} "
                          "or give a .jsonl file")
    return seeded_order(prompts, seed)[:n]


__all__ = ["WORKLOADS", "Prompt", "load_workload"]
