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
             whitespace, punctuation, digits, newlines (`avkit.hvd.token_classes`; 0 without a table)
  copy       matched suffix + draft occurs verbatim in the prompt; in the output so far
`RequestFeatures` computes them for one request, position by position: the replay and the live
drafter both drive it, so their features are the same by construction. The copy features search the prompt's
and the output's text, one character per token (`_text`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from avkit.hvd.suffix_cache import CacheDraft, common_prefix
from avkit.hvd.token_classes import CLASSES

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
