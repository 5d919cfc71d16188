"""Built-in prompt sets (HumanEval, MT-Bench, ShareGPT, BFCL, and their reuse variants) and JSONL files, as `Prompt` lists."""

from avkit.workloads import bfcl, editing, humaneval, mtbench, multiturn, sharegpt  # noqa: F401  (register loaders)
from avkit.workloads.base import WORKLOADS, Prompt, load_workload, register

__all__ = ["WORKLOADS", "Prompt", "load_workload", "register"]
