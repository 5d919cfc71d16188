"""TextStream: incremental detokenization and stop sequences against whole-text oracles."""

from __future__ import annotations

import random

import pytest

from avkit.models.testing import train_tokenizer
from avkit.models.tokenizer import Tokenizer
from avkit.serve.completions import TextStream

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "héllo wörld ✓ — naïve café 日本語 🙂🙂 done",
    "for i in range(10):\n    print(i * i)  # squares\n\n\nend",
]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(train_tokenizer(400), None, {2})


def _decode(tok):
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


def _chunks(ids, rng):
    i = 0
    while i < len(ids):
        n = rng.randint(1, 4)  # the engine emits 1..K+1 tokens per step
        yield ids[i:i + n]
        i += n


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streamed_text_equals_whole_decode(tok, text, seed):
    ids = tok.encode(text)
    ts = TextStream(_decode(tok))
    out = "".join(ts.push(c) for c in _chunks(ids, random.Random(seed))) + ts.finish()
    assert out == tok.decode(ids, skip_special_tokens=True) == text
    assert ts.num_tokens == len(ids)


def test_random_byte_tokens_never_emit_partial_characters(tok):
    """Arbitrary id sequences (split multi-byte characters) still concatenate to the whole decode."""
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(3, 400) for _ in range(rng.randint(1, 30))]
        ts = TextStream(_decode(tok))
        parts = [ts.push(c) for c in _chunks(ids, rng)]
        out = "".join(parts) + ts.finish()
        assert out == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("stop", [["return"], ["\n\n"], ["squares", "zzz"], ["✓ —"], ["🙂"]])
@pytest.mark.parametrize("seed", [0, 3])
def test_stop_sequence_truncates_like_str_find(tok, stop, seed):
    for text in TEXTS:
        ids = tok.encode(text)
        full = tok.decode(ids, skip_special_tokens=True)
        hits = [full.find(s) for s in stop if full.find(s) >= 0]
        expected = full[:min(hits)] if hits else full
        ts = TextStream(_decode(tok), stop)
        parts = []
        for c in _chunks(ids, random.Random(seed)):
            parts.append(ts.push(c))
            if ts.stopped:
                break
        out = "".join(parts) + ts.finish()
        assert out == expected
        assert ts.stopped == bool(hits)
        assert not any(s in out for s in stop)  # no part of a stop sequence was ever emitted


def test_push_after_stop_is_ignored(tok):
    ts = TextStream(_decode(tok), ["b"])
    ts.push(tok.encode("a b c"))
    assert ts.stopped and ts.push(tok.encode("more")) == "" and ts.text == "a "
