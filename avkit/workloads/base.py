"""A prompt (chat messages or raw text, tool schemas, follow-up user turns asked after the model's own
answer), its seeded order, and the one reader of prompt files: JSONL rows {"prompt": str} or
{"messages": [...]}, optional "id", "tools", "followups"."""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path

from avkit.errors import ConfigError


@dataclass(frozen=True)
class Prompt:
    """One prompt of a workload."""

    dataset: str  # workload name, e.g. "humaneval"
    prompt_id: str  # identifier within the dataset, e.g. "HumanEval/0"
    messages: tuple[dict, ...] = ()  # chat messages [{"role", "content"}]; empty for raw text
    text: str | None = None  # raw completion text (used when messages is empty)
    tools: tuple[dict, ...] | None = None  # OpenAI-style tool schemas, rendered by the chat template
    followups: tuple[str, ...] = ()  # user turns appended after each model answer

    def __post_init__(self):
        if not self.messages and not self.text:
            raise ConfigError(f"prompt {self.dataset}/{self.prompt_id}: needs messages or text")

    def token_ids(self, tokenizer, messages: tuple[dict, ...] | None = None) -> list[int]:
        """The prompt (or `messages`, a later turn of its conversation) as the target's token ids: the chat
        template with the prompt's tools, or the raw text (what `avkit record` and bench/ send to an engine)."""
        messages = self.messages if messages is None else messages
        if not messages:
            return tokenizer.encode(self.text)
        return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                             tools=list(self.tools) if self.tools else None)


def seeded_order(items: list, seed: int) -> list:
    """A seeded permutation of `items` (stable across runs and platforms)."""
    order = list(items)
    random.Random(seed).shuffle(order)
    return order


def jsonl_rows(path: Path):
    """Yield (line number, parsed value) of each non-blank line of a JSONL file (gzipped when it ends in
    .gz): the one reader of prompt files, user-given and packaged. Errors name file and line."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror or e})") from None
    for lineno, data in enumerate((gzip.decompress(raw) if path.suffix == ".gz" else raw).splitlines(), 1):
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}:{lineno}: not UTF-8 (byte {data[e.start]:#04x} at column {e.start + 1})") \
                from None
        if line.strip():
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None


def load_jsonl(path) -> list[Prompt]:
    """Prompts of a JSONL file; the dataset name is the file stem. Errors name file and line."""
    p = Path(path)
    prompts = [_row_to_prompt(row, p, lineno) for lineno, row in jsonl_rows(p)]
    if not prompts:
        raise ConfigError(f"{p}: no prompts")
    return prompts


def _row_to_prompt(row, p: Path, lineno: int) -> Prompt:
    if not isinstance(row, dict) or not (isinstance(row.get("prompt"), str) or isinstance(row.get("messages"), list)):
        raise ConfigError(f"{p}:{lineno}: a row needs a string 'prompt' or a list 'messages'")
    messages = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
    if not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
        raise ConfigError(f"{p}:{lineno}: each message needs 'role' and 'content'")
    tools = row.get("tools")
    return Prompt(p.stem, str(row.get("id", lineno)), messages=tuple(messages),
                  tools=tuple(tools) if tools else None, followups=tuple(row.get("followups", ())))
