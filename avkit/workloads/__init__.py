"""Built-in prompt sets (HumanEval, MT-Bench, ShareGPT, BFCL) and JSONL files, as `Prompt` lists."""

from avkit.workloads import bfcl, humaneval, mtbench, sharegpt  # noqa: F401  (register loaders)
from avkit.workloads.base import WORKLOADS, Prompt, load_workload, register

__all__ = ["WORKLOADS", "Prompt", "load_workload", "register"]
