"""Synthetic generations with known copy structure, for tests and demos before real traces exist.

Each output is built from spans: copies of the prompt (code edits), copies of a pool of boilerplate
shared across requests (what the global tree learns), fresh random tokens, and copies with one
token changed midway (the state-dependent mismatches a payoff predictor must learn to distrust).
The model drafter's teacher-forced matches are iid Bernoulli(`model_rate`).
"""

from __future__ import annotations

import numpy as np

from avkit.hvd.replay import ReplayGeneration

# dataset -> probabilities of span kinds (prompt copy, boilerplate copy, mutated copy, fresh)
PROFILES = {"code": (0.45, 0.2, 0.15, 0.2), "chat": (0.1, 0.05, 0.05, 0.8)}


def _output(rng, prompt: list[int], pool: list[list[int]], n: int, mix, vocab: int) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        kind = rng.choice(4, p=mix)
        span = int(rng.integers(3, 20))
        if kind == 3:
            out.extend(rng.integers(0, vocab, span).tolist())
            continue
        src = prompt if kind in (0, 2) else pool[int(rng.integers(len(pool)))]
        i = int(rng.integers(0, max(len(src) - span, 1)))
        piece = list(src[i:i + span])
        if kind == 2 and len(piece) > 2:
            piece[int(rng.integers(1, len(piece)))] = int(rng.integers(0, vocab))
        out.extend(piece)
    return out[:n]


def synthetic_generations(num_requests: int = 40, seed: int = 0, vocab: int = 500, prompt_len: int = 120,
                          output_len: int = 200, model_rate: float = 0.75) -> list[ReplayGeneration]:
    """Generations alternating between the `code` and `chat` profiles."""
    rng = np.random.default_rng(seed)
    pool = [rng.integers(0, vocab, 40).tolist() for _ in range(8)]
    gens = []
    for r in range(num_requests):
        dataset = ("code", "chat")[r % 2]
        prompt = rng.integers(0, vocab, prompt_len).tolist()
        out = _output(rng, prompt, pool, output_len, PROFILES[dataset], vocab)
        gens.append(ReplayGeneration(f"req{r}", dataset, prompt, out, rng.random(output_len) < model_rate))
    return gens
