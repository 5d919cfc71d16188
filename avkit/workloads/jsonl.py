"""Any JSONL file of {"prompt": str} or {"messages": [...]} rows (optional "id", "tools", "followups")."""

from __future__ import annotations

import json
from pathlib import Path

from avkit.errors import ConfigError
from avkit.workloads.base import Prompt


def load_jsonl(path) -> list[Prompt]:
    """Prompts of a JSONL file; the dataset name is the file stem. Errors name file and line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"dataset file not found: {p}")
    prompts = []
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read ({e.strerror or e})") from None
    for lineno, data in enumerate(raw.splitlines(), 1):
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{p}:{lineno}: not UTF-8 (byte {data[e.start]:#04x} at column {e.start + 1})") from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}:{lineno}: invalid JSON ({e.msg})") from None
        prompts.append(_row_to_prompt(row, p, lineno))
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
