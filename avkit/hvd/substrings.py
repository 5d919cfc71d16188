"""Does a token sequence occur in a growing text? A suffix automaton answers it incrementally.

The live hybrid drafter asks, every step, whether the cache draft's context + draft ("tail",
<= max_depth + K tokens) occurs in the prompt and in the output so far (`in_prompt`,
`in_output`, docs/hvd.md). Searching the whole output each step costs O(n) per step, O(n^2) per
request. A suffix automaton (Blumer et al. 1985) over the text is extended by one state per
appended token (amortised O(1)) and answers "is `pattern` a substring" in O(len(pattern)) by
walking transitions from the start state, whatever the text's length.

Glossary:
  state    an equivalence class of substrings sharing their end positions; state 0 is the empty string
  next     per state: token -> state (the transition on appending that token)
  link     per state: the suffix link (the longest suffix in another class)
  length   per state: the longest substring in its class
"""

from __future__ import annotations

from collections.abc import Iterable


class SubstringIndex:
    """Token-aligned substring queries over a sequence that only grows at its end.

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
        self.size = 0  # tokens appended so far
        for tok in tokens:
            self.append(tok)

    def append(self, token: int) -> None:
        """Extend the text by one token (amortised O(1) states and transitions)."""
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
        self.size += 1

    def contains(self, pattern: Iterable[int]) -> bool:
        """True when `pattern` occurs contiguously in the text (the empty pattern always does)."""
        state, nxt = 0, self._next
        for tok in pattern:
            state = nxt[state].get(tok, -1)
            if state < 0:
                return False
        return True


__all__ = ["SubstringIndex"]
