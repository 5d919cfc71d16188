"""Built-in prompt sets (HumanEval, MT-Bench, ShareGPT, BFCL, and their reuse variants) and JSONL files, as `Prompt` lists."""

from __future__ import annotations

from pathlib import Path

from avkit.errors import ConfigError
from avkit.workloads import editing, sets  # noqa: F401  (register loaders)
from avkit.workloads.base import WORKLOADS, Prompt, load_jsonl, register, seeded_order


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
        prompts = seeded_order(load_jsonl(name_or_path), seed)
    else:
        raise ConfigError(f"unknown dataset {name_or_path!r}: choose from {sorted(WORKLOADS)} "
                          "or give a .jsonl file")
    return prompts if n is None else prompts[:n]


__all__ = ["WORKLOADS", "Prompt", "load_workload", "register"]
