"""BFCL tool-calling prompts (PyPI `bfcl-eval`): the first user turn with its function schemas.

BFCL writes JSON-schema objects as type "dict"; tool schemas are converted to the OpenAI form
({"type": "function", "function": {...}}, type "object") that chat templates render.
"""

from __future__ import annotations

import json

from avkit.workloads.base import Prompt, register, seeded_order
from avkit.workloads.packages import package_data

# Single-turn categories whose rows are {"id", "question": [[messages...]], "function": [...]}.
CATEGORIES = (
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
    "irrelevance", "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
    "live_irrelevance", "live_relevance",
)


def to_json_schema(node):
    """BFCL's schema dialect -> JSON schema: type "dict" becomes "object" (recursively)."""
    if isinstance(node, dict):
        out = {k: to_json_schema(v) for k, v in node.items()}
        if out.get("type") == "dict":
            out["type"] = "object"
        return out
    if isinstance(node, list):
        return [to_json_schema(v) for v in node]
    return node


def to_prompt(row: dict) -> Prompt | None:
    turns = row.get("question") or []
    messages = tuple(m for m in (turns[0] if turns else []) if m.get("content"))
    if not messages or messages[-1].get("role") != "user":
        return None
    tools = tuple({"type": "function", "function": to_json_schema(f)} for f in row.get("function", []))
    return Prompt("bfcl", row["id"], messages=messages, tools=tools or None)


@register("bfcl")
def load_bfcl(seed: int) -> list[Prompt]:
    root = package_data("bfcl_eval", "bfcl-eval", "data", "README.md").parent
    prompts = []
    for cat in CATEGORIES:
        path = root / f"BFCL_v4_{cat}.json"
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            prompt = to_prompt(json.loads(line)) if line.strip() else None
            if prompt is not None:
                prompts.append(prompt)
    return seeded_order(prompts, seed)
