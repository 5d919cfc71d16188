"""Token-structure indicators for the payoff predictor: one boolean row per vocabulary id.

Glossary (a token is the text it decodes to on its own; byte-level BPE stand-ins such as `Ġ` = space and
`Ċ` = newline decoded first):
  ident    contains a letter or underscore (identifiers, keywords, words)
  space    contains a space or tab
  punct    contains a character that is neither alphanumeric nor whitespace (code punctuation)
  digit    contains a digit
  newline  contains a newline
Which vocabulary gives the table (`token_classes_for`; docs/hvd.md "Which vocabulary"): an explicit
`--tokenizer` (a failure is an error; `none` leaves the features out), the trace's target (`avkit.target`) when
its files are local, a table shipped for that exact target (`classes/<target_sha256[:16]>.npz`: `bits` =
`np.packbits` of the [V, 5] table along V, `vocab` = V), else none, which `source` says aloud.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avkit.errors import ModelError
from avkit.staged import staged_file

CLASSES = ("ident", "space", "punct", "digit", "newline")
SHIPPED = Path(__file__).parent / "classes"


def class_table(vocab: list[str]) -> np.ndarray:
    """[V, 5] bool: the CLASSES indicators of each token's text (byte-level stand-ins decoded by the
    tokenizers library's ByteLevel decoder, which keeps a token with other characters as it is; a
    sentencepiece `▁` read as a space)."""
    from tokenizers import decoders  # lazy: tokenizers

    byte_level = decoders.ByteLevel()
    out = np.zeros((len(vocab), len(CLASSES)), dtype=bool)
    for i, tok in enumerate(vocab):
        text = tok.replace("▁", " ") if "▁" in tok else byte_level.decode([tok])
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


@dataclass(frozen=True)
class TokenClasses:
    table: np.ndarray | None  # [V, len(CLASSES)] bool, None: structure features left out
    source: str  # where the table came from, or why there is none (shown by the CLI and the report)


def load_shipped(target_sha256: str) -> tuple[np.ndarray, Path] | None:
    """([V, 5] the table shipped for this target, its file), or None."""
    p = SHIPPED / f"{target_sha256[:16]}.npz"
    if not target_sha256 or not p.is_file():
        return None
    with np.load(p) as z:
        return np.unpackbits(z["bits"], axis=0, count=int(z["vocab"]))[:, : len(CLASSES)].astype(bool), p


def token_classes_for(paths, tokenizer: str | None = None) -> TokenClasses:
    """The structure table for traces `paths` (the first one's target decides), see the module docstring."""
    from avkit.models.registry import resolve  # lazy: torch (avkit.models)
    from avkit.trace.reader import trace_metadata  # lazy: polars

    if tokenizer == "none":
        return TokenClasses(None, "--tokenizer none: token-structure features left out")
    if tokenizer:
        return TokenClasses(class_table_for(tokenizer), f"--tokenizer {tokenizer}")
    meta = trace_metadata(paths[0]) if paths else {}  # a missing or bad file is named
    target, sha = meta.get("avkit.target", ""), meta.get("avkit.target_sha256", "")
    if target:
        try:
            path = resolve(target)
            return TokenClasses(class_table_for(path), f"the trace's target {target} ({path})")
        except ModelError:
            pass
    shipped = load_shipped(sha)
    if shipped is not None:
        return TokenClasses(shipped[0], f"the class table shipped for target {target or '?'} "
                                        f"(sha256 {sha[:12]}…, {shipped[1].name})")
    what = f"target {target!r}" if target else "the traces (no avkit.target in their metadata)"
    return TokenClasses(None, f"no vocabulary for {what}: token-structure features LEFT OUT, so the payoff "
                              "scores differ; `avkit models fetch` or --tokenizer PATH adds them")


__all__ = ["TokenClasses", "token_classes_for"]
