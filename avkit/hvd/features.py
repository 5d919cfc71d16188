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
drafter both drive it, so their features are the same by construction. A position costs O(W) and
not O(n): the copy features query suffix automata (`SubstringIndex`) extended token by token.
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


class SubstringIndex:
    """Does a token sequence occur in a text that only grows at its end? A suffix automaton (Blumer et al.
    1985) gains one state per appended token (amortised O(1)) and answers in O(len(pattern)), whatever
    the text's length. State 0 is the empty string; `next` maps token -> state, `link` is the suffix link
    (the longest suffix in another class), `length` the longest substring of the state's class.

    >>> ix = SubstringIndex([5, 6, 7])
    >>> ix.contains([6, 7]), ix.contains([7, 6])
    (True, False)
    >>> ix.append(6); ix.contains([7, 6])
    True
    """

    def __init__(self, tokens: Iterable[int] = ()):
        self._next: list[dict[int, int]] = [{}]
        self._link: list[int] = [-1]
        self._length: list[int] = [0]
        self._last = 0
        for tok in tokens:
            self.append(tok)

    def append(self, token: int) -> None:
        nxt, link, length = self._next, self._link, self._length
        cur = len(length)
        nxt.append({})
        link.append(0)
        length.append(length[self._last] + 1)
        p = self._last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:  # split q: a clone takes the shorter strings of q's class
                clone = len(length)
                nxt.append(dict(nxt[q]))
                link.append(link[q])
                length.append(length[p] + 1)
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self._last = cur

    def contains(self, pattern: Iterable[int]) -> bool:
        """True when `pattern` occurs contiguously in the text (the empty pattern always does)."""
        state, nxt = 0, self._next
        for tok in pattern:
            state = nxt[state].get(tok, -1)
            if state < 0:
                return False
        return True


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
        self.in_prompt, self.in_output = SubstringIndex(prompt), SubstringIndex()

    def append(self, token: int, draft: list[int], hit: bool = True) -> None:
        """Position t is decided: its token, the cache draft made before it, the model's hit there."""
        self.seq.append(token)
        self.drafts.append(draft)
        self.hits.append(hit)
        self.in_output.append(token)

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
             "in_prompt": float(bool(tail) and self.in_prompt.contains(tail)),
             "in_output": float(bool(tail) and self.in_output.contains(tail))}
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
