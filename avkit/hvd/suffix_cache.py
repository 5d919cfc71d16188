"""SuffixDecoding-style cache drafter: parameter-free drafts from the prompt, the output so far and
past responses (Oliaro et al., SuffixDecoding, arXiv 2411.04975; docs/hvd.md).

Glossary:
  suffix trie   counts of every substring of length <= max_depth of a set of sequences: inserting
                token x_n walks the (at most max_depth) "active" nodes where the suffixes ending at
                x_{n-1} stop, and moves each one child down. count(node) = occurrences of its string.
  match_len     m, length of the suffix of the context (prompt + output) the draft continues from.
  draft         the most frequent continuation path below the match node: at each step the child
                with the largest count (ties: smallest token id), with path probability
                P_j = prod_{i<=j} count(child_i) / count(parent_i). Drafting stops at K tokens, at
                floor(m * max_spec_factor + max_spec_offset) tokens, or when P_j < min_token_prob.
  score         sum_j P_j, the draft's expected accepted length under the frequency model. Among all
                match lengths (and the local and global trees) the draft with the largest score wins;
                ties go to the longer match, then to the local tree (ArcticInference's rule).
  local tree    one per request over prompt + output (the trailing occurrence of the pattern is in
                it, so a first occurrence yields no draft and repeats are slightly discounted).
  global tree   past responses, shared by every request, FIFO-evicted by request beyond
                `max_cached_requests` responses or `max_cached_tokens` tokens (memory: docs/hvd.md).
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, field

from avkit.config import SuffixCacheConfig
from avkit.errors import ConfigError

# A trie node is a two-item list [count, children: dict[token, node] | None]: a list literal is
# several times cheaper to create than an object, appends create up to max_depth nodes per token,
# and most nodes are leaves, so their children dict is only made when a first child arrives.
Node = list  # [count: int, children: dict[int, Node] | None]
COUNT, CHILDREN = 0, 1
NODE_BYTES = 285  # CPython 3.11, 64-bit, per node with its share of the parent's dict (`deep_bytes`: exact)


@dataclass
class CacheDraft:
    """One cache draft and the runtime features the payoff predictor reads."""

    tokens: list[int] = field(default_factory=list)  # [draft_len] proposed token ids
    probs: list[float] = field(default_factory=list)  # [draft_len] path frequency probabilities P_j
    match_len: int = 0  # m; 0 when there is no draft
    score: float = 0.0  # sum(probs)
    source: str = ""  # "local" (prompt + output) or "global" (past responses); "" when empty

    @property
    def draft_len(self) -> int:
        return len(self.tokens)

    def features(self) -> dict[str, float]:
        """The payoff features of the draft itself (hvd/features.py's `base` group less the two positions),
        for the replay and the live drafter alike."""
        return {"match_len": self.match_len, "draft_len": self.draft_len, "score": self.score,
                "mean_prob": self.score / max(self.draft_len, 1), "first_prob": self.probs[0] if self.probs else 0.0,
                "last_prob": self.probs[-1] if self.probs else 0.0, "source_global": float(self.source == "global")}


class SuffixTrie:
    """Substring counts (length <= max_depth) over sequences that grow one token at a time."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root: Node = [0, None]
        self.num_nodes = 1
        self._seqs: dict[int, list[int]] = {}
        self._active: dict[int, list[Node]] = {}  # seq -> [node of its last m tokens, m = 1..]

    def append(self, seq_id: int, token: int) -> None:
        seq = self._seqs.setdefault(seq_id, [])
        active = self._active.get(seq_id, [])
        new_active = []
        # every suffix ending at the previous token (and the empty one at the root) grows by `token`,
        # except the one already max_depth long
        for node in [self.root, *active[: self.max_depth - 1]]:
            kids = node[CHILDREN]
            if kids is None:
                kids = node[CHILDREN] = {}
            child = kids.get(token)
            if child is None:
                child = kids[token] = [0, None]
                self.num_nodes += 1
            child[COUNT] += 1
            new_active.append(child)
        self.root[COUNT] += 1
        self._active[seq_id] = new_active
        seq.append(token)

    def extend(self, seq_id: int, tokens) -> None:
        for t in tokens:
            self.append(seq_id, int(t))

    def remove(self, seq_id: int) -> None:
        """Forget a sequence: undo the counts of each of its suffixes, dropping nodes that reach 0."""
        seq = self._seqs.pop(seq_id)
        self._active.pop(seq_id, None)
        n = len(seq)
        for start in range(n):
            self.root[COUNT] -= 1
            node, end = self.root, min(start + self.max_depth, n)
            for j in range(start, end):
                child = node[CHILDREN][seq[j]]
                child[COUNT] -= 1
                if child[COUNT] == 0:
                    # its subtree held only this suffix: a chain of the remaining end - j nodes
                    del node[CHILDREN][seq[j]]
                    self.num_nodes -= end - j
                    break
                node = child

    def match_nodes(self, pattern: list[int]) -> list[Node]:
        """Nodes of pattern[-m:] for m = 1.. while they exist (a suffix of a stored substring is stored)."""
        out = []
        n = len(pattern)
        for m in range(1, min(n, self.max_depth) + 1):
            node = self.root
            for t in pattern[n - m:]:
                node = node[CHILDREN].get(t) if node[CHILDREN] else None
                if node is None:
                    return out
            out.append(node)
        return out

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    @property
    def num_tokens(self) -> int:
        return self.root[COUNT]

    def deep_bytes(self) -> int:
        """Bytes of every node and children dict by sys.getsizeof (O(nodes): for benches and tests)."""
        total, stack = sys.getsizeof(self.root), [self.root]
        while stack:
            kids = stack.pop()[CHILDREN]
            if kids:
                total += sys.getsizeof(kids) + sum(sys.getsizeof(v) for v in kids.values())
                stack.extend(kids.values())
        return total


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists: a draft's accepted length against the output."""
    n = 0
    for x, y in zip(a, b):  # a plain loop: ~4x faster than next(enumerate(...)) on drafts of <= K tokens
        if x != y:
            break
        n += 1
    return n


def _walk(node: Node, max_tokens: int, min_prob: float) -> tuple[list[int], list[float]]:
    """Most frequent continuation below `node`, stopping when the path probability drops below min_prob."""
    tokens, probs, prob = [], [], 1.0
    while len(tokens) < max_tokens and node[CHILDREN]:
        tok, child = max(node[CHILDREN].items(), key=lambda kv: (kv[1][COUNT], -kv[0]))
        prob *= child[COUNT] / node[COUNT]
        if prob < min_prob:
            break
        tokens.append(tok)
        probs.append(prob)
        node = child
    return tokens, probs


def best_draft(nodes: list[Node], k: int, config: SuffixCacheConfig, source: str) -> CacheDraft:
    """Highest-score draft over match lengths m = len(nodes)..1 (nodes[m-1] is the node of length m)."""
    best = CacheDraft()
    for m in range(len(nodes), 0, -1):
        cap = min(k, int(m * config.max_spec_factor + config.max_spec_offset + 1e-6))
        if cap <= 0 or best.score >= cap:
            break  # caps shrink with m: no shorter match can beat the best score any more
        tokens, probs = _walk(nodes[m - 1], cap, config.min_token_prob)
        score = sum(probs)
        if score > best.score:
            best = CacheDraft(tokens, probs, m, score, source)
    return best


class SuffixCache:
    """The cache drafter: a local trie per live request and a global trie over past responses.

    >>> cache = SuffixCache(SuffixCacheConfig(min_token_prob=0.0))
    >>> cache.start_request("r", [5, 6, 7, 8, 5, 6])
    >>> cache.draft("r", k=4).tokens
    [7, 8]
    """

    def __init__(self, config: SuffixCacheConfig = SuffixCacheConfig()):
        self.config = config
        self.global_trie = SuffixTrie(config.max_depth)
        self._local: dict[str, tuple[SuffixTrie, int]] = {}  # request -> (its trie over sequence 0, prompt length)
        self._fifo: deque[int] = deque()  # global sequence ids, oldest first
        self._next_seq = 0
        self.evicted = 0  # responses evicted from the global tree so far

    def start_request(self, request_id: str, prompt_ids) -> None:
        if request_id in self._local:
            raise ConfigError(f"suffix cache: request_id {request_id!r} is already active")
        trie = SuffixTrie(self.config.max_depth)
        trie.extend(0, prompt_ids)
        self._local[request_id] = (trie, trie.num_tokens)

    def append(self, request_id: str, token_ids) -> None:
        """Add newly generated tokens of a live request."""
        self._trie(request_id)[0].extend(0, token_ids)

    def draft(self, request_id: str, k: int) -> CacheDraft:
        """Draft up to k tokens continuing the request's context."""
        trie = self._trie(request_id)[0]
        best = best_draft(trie._active.get(0, []), k, self.config, "local")  # nodes of its own last m tokens
        if self.config.use_global and self.global_trie.num_sequences:
            context = trie._seqs[0][-self.config.max_depth:]
            glob = best_draft(self.global_trie.match_nodes(context), k, self.config, "global")
            if glob.score > best.score:
                best = glob
        return best

    def finish_request(self, request_id: str, cache_response: bool = True) -> None:
        """Drop the local trie; add the response to the global trie (evicting the oldest beyond the cap)."""
        trie, prompt_len = self._trie(request_id)
        del self._local[request_id]
        output = trie._seqs[0][prompt_len:]
        cfg = self.config
        if not (cache_response and cfg.use_global and output and cfg.max_cached_requests):
            return
        if cfg.max_cached_tokens and len(output) > cfg.max_cached_tokens:
            output = output[-cfg.max_cached_tokens:]  # a response longer than the budget: its tail
        seq_id, self._next_seq = self._next_seq, self._next_seq + 1
        self.global_trie.extend(seq_id, output)
        self._fifo.append(seq_id)
        while len(self._fifo) > cfg.max_cached_requests or (
                cfg.max_cached_tokens and self.global_trie.num_tokens > cfg.max_cached_tokens):
            self.global_trie.remove(self._fifo.popleft())
            self.evicted += 1

    def abandon_live(self) -> None:
        """Drop every live request without caching its response (the engine that ran them is gone)."""
        for rid in list(self._local):
            self.finish_request(rid, cache_response=False)

    @property
    def num_nodes(self) -> int:
        """Trie nodes held (local + global): the memory measure, NODE_BYTES each."""
        return self.global_trie.num_nodes + sum(t.num_nodes for t, _ in self._local.values())

    def memory(self) -> dict[str, float]:
        """Tokens, nodes and estimated bytes of the global and local trees, and bytes per cached
        (global) token; O(live requests), cheap enough for every /metrics scrape."""
        g, local = self.global_trie, [t for t, _ in self._local.values()]
        g_tok = g.num_tokens
        return {"global_tokens": g_tok, "global_nodes": g.num_nodes, "global_bytes": g.num_nodes * NODE_BYTES,
                "global_responses": len(self._fifo), "budget_tokens": self.config.max_cached_tokens,
                "local_tokens": sum(t.num_tokens for t in local),
                "local_nodes": sum(t.num_nodes for t in local),
                "local_bytes": sum(t.num_nodes for t in local) * NODE_BYTES,
                "bytes_per_cached_token": g.num_nodes * NODE_BYTES / g_tok if g_tok else 0.0,
                "evicted_responses": self.evicted}

    def _trie(self, request_id: str) -> tuple[SuffixTrie, int]:
        if request_id not in self._local:
            raise ConfigError(f"suffix cache: unknown request_id {request_id!r}")
        return self._local[request_id]
