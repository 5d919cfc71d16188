"""Token ids -> text deltas, with stop sequences, for one request (the prefix window and held-back text:
docs/runtime.md, "Serving")."""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class TextStream:
    """Feed token ids as they arrive; get the text that is safe to emit."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()):
        self._decode = decode
        self._stop = list(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1  # chars that may start a stop
        self._ids: list[int] = []
        self._prefix_offset = 0  # first id of the decode window
        self._read_offset = 0  # ids before this are already turned into text
        self.text = ""  # all text decoded so far (after stop truncation)
        self._emitted = 0  # len of text already returned by push()
        self.stopped = False  # a stop sequence was found; the caller cancels the request

    @property
    def num_tokens(self) -> int:
        return len(self._ids)

    def push(self, new_ids: Sequence[int]) -> str:
        """Add generated ids; return the new text that can be emitted now ('' if none)."""
        if self.stopped or not new_ids:
            return ""
        self._ids.extend(int(t) for t in new_ids)
        self._decode_new(final=False)
        return self._take(final=False)

    def finish(self) -> str:
        """The request ended: flush held-back text (an incomplete character decodes as U+FFFD)."""
        if not self.stopped:
            self._decode_new(final=True)
        return self._take(final=True)

    def _decode_new(self, final: bool) -> None:
        """Text of the ids after the read offset, decoded with the prefix window; an incomplete character
        waits for more ids unless `final`."""
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full = self._decode(self._ids[self._prefix_offset:])
        if final or (len(full) > len(prefix) and not full.endswith(REPLACEMENT)):
            self._append(full[len(prefix):])
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)

    def _append(self, delta: str) -> None:
        start = max(0, len(self.text) - self._hold)  # a stop may straddle old and new text
        self.text += delta
        hits = [i for i in (self.text.find(s, start) for s in self._stop) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True

    def _take(self, final: bool) -> str:
        end = len(self.text) if (final or self.stopped) else max(self._emitted,
                                                                  len(self.text) - self._hold)
        out = self.text[self._emitted:end]
        self._emitted = end
        return out
