"""Token-structure indicators for the payoff predictor: one boolean row per vocabulary id.

Glossary (a token is the text it decodes to on its own):
  ident    contains a letter or underscore (identifiers, keywords, words)
  space    contains a space or tab
  punct    contains a character that is neither alphanumeric nor whitespace (code punctuation)
  digit    contains a digit
  newline  contains a newline
Byte-level BPE vocabularies (Qwen2, Llama 3, GPT-2) store bytes as printable stand-ins
(`Ġ` = space, `Ċ` = newline); `token_text` maps them back.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from avkit.errors import ModelError
from avkit.staged import staged_file

CLASSES = ("ident", "space", "punct", "digit", "newline")


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_text(token: str) -> str:
    """Decode one byte-level (or sentencepiece `▁`) vocabulary entry to text; keeps unknown chars."""
    dec = _byte_decoder()
    if all(ch in dec for ch in token):
        return bytes(dec[ch] for ch in token).decode("utf-8", errors="replace")
    return token.replace("▁", " ")


def class_table(vocab: list[str]) -> np.ndarray:
    """[V, 5] bool: the CLASSES indicators of each token's text."""
    out = np.zeros((len(vocab), len(CLASSES)), dtype=bool)
    for i, tok in enumerate(vocab):
        text = token_text(tok)
        out[i] = (
            any(c.isalpha() or c == "_" for c in text),
            " " in text or "\t" in text,
            any(not (c.isalnum() or c.isspace()) for c in text),
            any(c.isdigit() for c in text),
            "\n" in text,
        )
    return out


def load_vocab(path_or_id: str | os.PathLike) -> list[str]:
    """Vocabulary entries by id from a GGUF file or an HF directory (tokenizer.json), without weights."""
    from avkit.models.registry import resolve  # lazy: torch (avkit.models)

    path = resolve(path_or_id)
    if path.is_dir():
        from tokenizers import Tokenizer  # lazy: tokenizers

        if not (path / "tokenizer.json").is_file():
            raise ModelError(f"{path}: no tokenizer.json")
        vocab = Tokenizer.from_file(str(path / "tokenizer.json")).get_vocab(with_added_tokens=True)
        out = [""] * (max(vocab.values()) + 1)
        for tok, i in vocab.items():
            out[i] = tok
        return out
    if path.suffix == ".gguf":
        from avkit.models.gguf_file import GGUFFile  # lazy: torch (avkit.models)

        tokens = GGUFFile(path).metadata.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise ModelError(f"{path}: GGUF has no tokenizer.ggml.tokens")
        return tokens
    raise ModelError(f"{path}: expected a model directory or a .gguf file")


def class_table_for(path_or_id: str | os.PathLike) -> np.ndarray:
    """`class_table(load_vocab(...))`, cached on disk beside the models (GGUF parsing takes seconds)."""
    from avkit.models.registry import models_dir, resolve  # lazy: torch (avkit.models)

    path = resolve(path_or_id)
    stat = path.stat()
    cache = models_dir() / "token_classes" / f"{path.name}-{stat.st_size}-{int(stat.st_mtime)}.npy"
    if cache.is_file():
        return np.load(cache)
    table = class_table(load_vocab(path))
    with staged_file(cache, "token-class cache") as tmp, open(tmp, "wb") as fh:
        np.save(fh, table)
    return table
