"""Runtime features of a cache-draft candidate for the payoff predictor (HVD, docs/hvd.md).

Every feature at decode position t uses only what the runtime knows before verifying there:
the cache state over prompt + output[:t], the draft itself, and outcomes already decided by
output[:t]. Groups (ablated in `bench/results/hvd.md`):
  base       match_len, draft_len, score, mean/first/last path probability, global-tree source,
             log decode position, log prompt length
  history    over the last W positions t' < t: cache accepted length truncated to what output[:t]
             reveals, min(acc_c[t'], t - t'); cache first-token hit rate; model first-token hit rate
             (teacher-forced match); model accepted length truncated the same way
  structure  share of draft tokens (and class of the last context token) that are identifiers,
             whitespace, punctuation, digits, newlines (the class table below; 0 without one)
  copy       matched suffix + draft occurs verbatim in the prompt; in the output so far
`RequestFeatures` computes them for one request, position by position: the replay and the live
drafter both drive it, so their features are the same by construction. The copy features search the prompt's
and the output's text, one character per token (`_text`).

The structure group's class table: one boolean row per vocabulary id, [V, 5]. Classes (a token is the text it
decodes to on its own; byte-level BPE stand-ins such as `Ġ` = space and `Ċ` = newline decoded first):
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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avkit.errors import ModelError
from avkit.hvd.suffix_cache import CacheDraft, common_prefix
from avkit.staged import staged_file

CLASSES = ("ident", "space", "punct", "digit", "newline")
SHIPPED = Path(__file__).parent / "classes"  # class tables shipped per target (module docstring)
FEATURE_GROUPS: dict[str, tuple[str, ...]] = {
    "base": ("match_len", "draft_len", "score", "mean_prob", "first_prob", "last_prob", "source_global",
             "log_position", "log_prompt_len"),
    "history": ("hist_cache_acc", "hist_cache_hit", "hist_model_hit", "hist_model_acc"),
    "structure": tuple(f"draft_{c}" for c in CLASSES) + tuple(f"ctx_{c}" for c in CLASSES),
    "copy": ("in_prompt", "in_output"),
}
ALL_FEATURES: tuple[str, ...] = tuple(n for g in FEATURE_GROUPS.values() for n in g)


def accept_lengths(match: np.ndarray, k: int) -> np.ndarray:
    """[N] bool -> [N] int64: min(k, run of consecutive True starting at each t).

    >>> accept_lengths(np.array([True, True, False, True]), k=7).tolist()
    [2, 1, 0, 1]
    """
    n = len(match)
    idx = np.arange(n)
    # next_false[t] = first index >= t with match False (n if none): reverse running minimum
    stops = np.where(match, n, idx)
    next_false = np.minimum.accumulate(stops[::-1])[::-1]
    return np.minimum(next_false - idx, k).astype(np.int64)


def _text(tokens: Iterable[int]) -> str:
    """One character per token id: a run of tokens occurs in a sequence iff its text occurs in the sequence's
    (`str.__contains__`, a linear search in C)."""
    return "".join(map(chr, tokens))


class RequestFeatures:
    """One request's payoff features at its current decode position t = len(output so far).

    Per position it keeps the cache draft made there (drafted before that position's token was
    appended) and the model hit m[t] (the draft model's token at t was the target's; True where
    unknown, as `avkit.hvd.replay.matches_from_trace` counts positions no step labels)."""

    def __init__(self, prompt: list[int], k: int, window: int, classes: np.ndarray | None):
        self.prompt_len, self.k, self.window, self.classes = len(prompt), k, window, classes
        self.seq = list(prompt)  # prompt + output so far
        self.drafts: list[list[int]] = []  # cache draft made at output position t
        self.hits: list[bool] = []  # model hit per output position
        self.prompt_text, self.output_text = _text(prompt), ""  # [len] one char per token (`_text`)

    def append(self, token: int, draft: list[int], hit: bool = True) -> None:
        """Position t is decided: its token, the cache draft made before it, the model's hit there."""
        self.seq.append(token)
        self.drafts.append(draft)
        self.hits.append(hit)
        self.output_text += chr(token)

    def row(self, d: CacheDraft) -> dict[str, float]:
        """Every feature of `ALL_FEATURES` for the cache draft `d` made at the current position."""
        p, t = self.prompt_len, len(self.drafts)
        lo = max(0, t - self.window)
        # the last W positions t' < t: the cache draft's accepted length against the output revealed since
        # (at most t - t' tokens), the model's run of hits inside the window (so also at most t - t'); the
        # sums are of integers, so exact
        acc = [common_prefix(d0, self.seq[p + i: p + i + len(d0)]) for i, d0 in enumerate(self.drafts[lo:], lo)]
        hits, w = self.hits[lo:], max(len(acc), 1)
        runs = int(accept_lengths(np.array(hits, dtype=bool), self.k).sum())
        hist = (sum(acc) / w, sum(a > 0 for a in acc) / w, sum(hits) / w, runs / w)
        tail = self.seq[len(self.seq) - d.match_len:] + d.tokens if d.tokens else []
        f = {**d.features(), "log_position": np.log1p(t), "log_prompt_len": np.log1p(p),
             **dict(zip(FEATURE_GROUPS["history"], hist)),
             "in_prompt": float(bool(tail) and _text(tail) in self.prompt_text),
             "in_output": float(bool(tail) and _text(tail) in self.output_text)}
        c = len(CLASSES)
        has = self.classes is not None
        draft_cls = self.classes[d.tokens].mean(0) if has and d.tokens else np.zeros(c)  # [5] the draft's shares
        ctx_cls = self.classes[self.seq[-1] if self.seq else 0] if has else np.zeros(c)  # [5] the last token's
        f.update({f"draft_{n}": float(v) for n, v in zip(CLASSES, draft_cls)})
        f.update({f"ctx_{n}": float(v) for n, v in zip(CLASSES, ctx_cls)})
        return f


def columns(rows: list[dict[str, float]]) -> dict[str, np.ndarray]:
    """Feature rows -> {name: [N] float64}."""
    return {n: np.array([r[n] for r in rows], dtype=np.float64) for n in rows[0]} if rows else {}


def feature_matrix(columns: dict[str, np.ndarray], names: tuple[str, ...]) -> np.ndarray:
    """[N, F] float32 in the order of `names`."""
    return np.stack([np.asarray(columns[n], dtype=np.float32) for n in names], axis=1)


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
