"""Check a target/draft pair from headers only, before any weights are loaded.

Speculative decoding compares the two models' distributions token by token, so both must share
one vocabulary. Loading the real pair takes minutes and ~10 GB; reading `config.json` or a GGUF
header (memory-mapped, no tensor data) takes seconds. Commands call `check_pair` first and fail fast with one line.
"""

from __future__ import annotations

import json
import os

from avkit.errors import ConfigError, ModelError
from avkit.models.registry import resolve


def vocab_size_of(path_or_id: str | os.PathLike) -> int:
    """Vocabulary size (rows of the embedding) of a model directory or GGUF file, from its header."""
    path = resolve(path_or_id)
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ModelError(f"{path}: model directory has no config.json")
        vocab = json.loads(config.read_text()).get("vocab_size")
        if not isinstance(vocab, int):
            raise ModelError(f"{config}: vocab_size missing or not an integer: {vocab!r}")
        return vocab
    if path.suffix == ".gguf":
        from avkit.models.gguf_file import GGUFFile

        tensors = GGUFFile(path).tensors
        if "token_embd.weight" not in tensors:
            raise ModelError(f"{path}: GGUF has no token_embd.weight")
        return int(tensors["token_embd.weight"].shape[0])
    raise ModelError(f"{path}: expected a model directory or a .gguf file")


def check_pair(target: str | os.PathLike, draft: str | os.PathLike | None) -> None:
    """Raise ConfigError if the draft's vocabulary differs from the target's (no-op without a draft)."""
    if draft is None or str(draft) in ("", "none"):
        return
    tv, dv = vocab_size_of(target), vocab_size_of(draft)
    if tv != dv:
        raise ConfigError(f"draft {str(draft)!r} has a {dv}-token vocabulary but target {str(target)!r} has "
                          f"{tv}: speculative decoding needs one shared vocabulary")


__all__ = ["check_pair", "vocab_size_of"]
