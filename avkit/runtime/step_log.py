"""A timed log of engine steps, and the decode rates read from it.

Glossary
--------
step log  one row per engine step: ``[seconds since start, tokens emitted so far, requests with a token,
          requests finished]``, written by bench/vllm_peer.py's `drive` for both engines (avkit's in
          bench/common.py, vLLM's in the peer process), so both are read by one rule.
steady    decode tok/s with every lane busy: from the step after which all n requests have a token (their
          prefill is done) to the last step before any finishes; the state the simulator predicts.
decode    tok/s over the steps in which no request got its first token (no prefill in the step).
"""

from __future__ import annotations


def steady_tok_s(steps: list[list[float]], n: int, waves: int = 1) -> float:
    """Steady decode tok/s of a step log (module glossary). ``waves`` of ``n`` requests run one after another
    (wave j arrives once the waves before it are done): each wave's window is cut the same way and the rate
    is their tokens over their seconds. NaN when no wave has a window of >= 1 step."""
    tokens = seconds = 0.0
    for j in range(waves):
        first = next((i for i, s in enumerate(steps) if s[2] >= (j + 1) * n), None)
        last = max((i for i, s in enumerate(steps) if s[3] <= j * n), default=None)
        if first is not None and last is not None and last > first:
            tokens += steps[last][1] - steps[first][1]
            seconds += steps[last][0] - steps[first][0]
    return tokens / seconds if seconds > 0 else float("nan")


def decode_tok_s(steps: list[list[float]]) -> float:
    """Tok/s over the steps of a step log in which no request got its first token; NaN without one."""
    tokens = seconds = 0.0
    for prev, cur in zip([[0.0, 0.0, 0.0, 0.0], *steps], steps):
        if cur[2] == prev[2]:
            tokens += cur[1] - prev[1]
            seconds += cur[0] - prev[0]
    return tokens / seconds if seconds > 0 else float("nan")
