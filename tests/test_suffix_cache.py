"""Suffix cache drafter against a brute-force longest-suffix search (the oracle counts substring
occurrences directly), plus bounded memory under FIFO eviction."""

from __future__ import annotations

import numpy as np
import pytest

from avkit.config import SuffixCacheConfig
from avkit.hvd.suffix_cache import SuffixCache, SuffixTrie
from avkit.errors import ConfigError


def _occ(seqs: list[list[int]], s: tuple[int, ...]) -> int:
    n = len(s)
    return sum(tuple(q[i:i + n]) == s for q in seqs for i in range(len(q) - n + 1))


def _brute_one(seqs, pattern, k, cfg) -> tuple[list[int], float, int]:
    """Best (tokens, score, match_len) over every suffix of the pattern, by direct counting."""
    best = ([], 0.0, 0)
    alphabet = sorted({t for q in seqs for t in q})
    for m in range(min(len(pattern), cfg.max_depth), 0, -1):
        s = tuple(pattern[-m:])
        if _occ(seqs, s) == 0:
            continue
        cap = min(k, int(m * cfg.max_spec_factor + cfg.max_spec_offset + 1e-6))
        tokens, prob, score = [], 1.0, 0.0
        while len(tokens) < cap and len(s) < cfg.max_depth:
            counts = [(_occ(seqs, s + (t,)), -t) for t in alphabet]
            c, neg_t = max(counts)
            if c == 0:
                break
            prob *= c / _occ(seqs, s)
            if prob < cfg.min_token_prob:
                break
            tokens.append(-neg_t)
            score += prob
            s = s + (-neg_t,)
        if score > best[1]:
            best = (tokens, score, m)
    return best


def _brute(local, past, pattern, k, cfg):
    loc = _brute_one([local], pattern, k, cfg)
    glob = _brute_one(past, pattern, k, cfg) if past else ([], 0.0, 0)
    return glob if glob[1] > loc[1] else loc


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cfg", [
    SuffixCacheConfig(max_depth=6, min_token_prob=0.0),
    SuffixCacheConfig(max_depth=5, min_token_prob=0.3, max_spec_factor=2.0, max_spec_offset=1.0),
])
def test_draft_matches_brute_force(seed, cfg):
    rng = np.random.default_rng(seed)
    vocab = 4  # tiny alphabet: many repeats, many ties
    cache = SuffixCache(cfg)
    past = []
    for r in range(3):
        prompt = rng.integers(0, vocab, 12).tolist()
        rid = f"r{r}"
        cache.start_request(rid, prompt)
        context = list(prompt)
        for _ in range(15):
            got = cache.draft(rid, k=5)
            want_tokens, want_score, want_m = _brute(context, past, context, 5, cfg)
            assert got.tokens == want_tokens
            assert got.score == pytest.approx(want_score, abs=1e-12)
            assert got.match_len == want_m
            assert got.draft_len <= 5
            tok = int(rng.integers(0, vocab))
            cache.append(rid, [tok])
            context.append(tok)
        past.append(context[len(prompt):])
        cache.finish_request(rid)


def test_no_draft_on_first_occurrence():
    cache = SuffixCache()
    cache.start_request("a", [1, 2, 3, 4])
    d = cache.draft("a", k=7)
    assert d.tokens == [] and d.score == 0.0 and d.match_len == 0


def _fresh_global_nodes(seqs, depth):
    trie = SuffixTrie(depth)
    for i, s in enumerate(seqs):
        trie.extend(i, s)
    return trie.num_nodes


def test_eviction_bounds_memory_and_restores_exact_counts():
    cfg = SuffixCacheConfig(max_depth=8, max_cached_requests=3)
    cache = SuffixCache(cfg)
    rng = np.random.default_rng(0)
    responses = []
    sizes = []
    for r in range(12):
        cache.start_request(str(r), [1, 2, 3])
        out = rng.integers(0, 50, 40).tolist()
        cache.append(str(r), out)
        cache.finish_request(str(r))
        responses.append(out)
        sizes.append(cache.global_trie.num_nodes)
        assert cache.global_trie.num_sequences == min(r + 1, 3)
    # bounded: never more than 3 responses * 40 tokens * depth 8 nodes (+ root)
    assert max(sizes) <= 3 * 40 * 8 + 1
    # removal undoes insertion exactly: same node count as a trie built from the 3 kept responses
    assert cache.global_trie.num_nodes == _fresh_global_nodes(responses[-3:], 8)
    assert cache.global_trie.root[0] == 3 * 40  # [count, children]
    assert cache.num_nodes == cache.global_trie.num_nodes  # no live request left


def test_unknown_and_duplicate_requests_raise():
    cache = SuffixCache()
    with pytest.raises(ConfigError, match="unknown request_id 'x'"):
        cache.draft("x", 3)
    cache.start_request("a", [1])
    with pytest.raises(ConfigError, match="already active"):
        cache.start_request("a", [1])
