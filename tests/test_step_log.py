"""avkit/runtime/step_log.py: the step log both engines are timed by, and the decode rates read from it.

The steady window is checked against a brute-force scan of every (first, last) step pair; the decode rate
against a hand-counted log."""

from __future__ import annotations

import math
import random

import pytest

from avkit.runtime.step_log import decode_tok_s, steady_tok_s


def _window(steps: list[list[float]], n: int) -> tuple[float, float] | None:
    """(tokens, seconds) over every (i, j) pair: i is the first step with n started requests, j the last with
    none finished."""
    best = None
    for i in range(len(steps)):
        for j in range(i + 1, len(steps)):
            if steps[i][2] >= n and all(s[2] < n for s in steps[:i]) and steps[j][3] == 0 \
                    and all(s[3] > 0 for s in steps[j + 1:]):
                best = (steps[j][1] - steps[i][1], steps[j][0] - steps[i][0])
    return best


def _brute(steps: list[list[float]], n: int) -> float:
    w = _window(steps, n)
    return float("nan") if w is None else w[0] / w[1]


def _random_wave(rng, n: int) -> list[list[float]]:
    t, tok, started, done, steps = 0.0, 0, 0, 0, []
    for _ in range(rng.randint(1, 30)):
        t += rng.uniform(0.01, 1.0)
        started = min(n, started + rng.randint(0, 2))
        tok += started * rng.randint(1, 4)
        done = min(started, done + (rng.random() < 0.15))
        steps.append([t, float(tok), float(started), float(done)])
    return steps


@pytest.mark.parametrize("seed", range(20))
def test_steady_rate_matches_a_brute_force_window(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    steps = _random_wave(rng, n)
    got, want = steady_tok_s(steps, n), _brute(steps, n)
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_steady_rate_of_waves_pools_each_waves_brute_force_window(seed):
    """Waves of n requests one after another (each wave ends with all its requests finished, the next starts
    after): the rate is the waves' window tokens over their window seconds, each window cut as for one wave."""
    rng = random.Random(seed)
    n, waves, steps, want = rng.randint(1, 4), rng.randint(1, 4), [], [0.0, 0.0]
    for j in range(waves):
        wave = _random_wave(rng, n)
        wave.append([wave[-1][0] + 0.5, wave[-1][1] + 1, float(n), float(n)])  # the wave drains
        if (w := _window(wave, n)) is not None:
            want = [want[0] + w[0], want[1] + w[1]]
        t0, tok0 = (steps[-1][0], steps[-1][1]) if steps else (0.0, 0.0)
        steps += [[t0 + t, tok0 + k, j * n + a, j * n + d] for t, k, a, d in wave]
    got = steady_tok_s(steps, n, waves=waves)
    assert (math.isnan(got) and want[1] == 0) or got == pytest.approx(want[0] / want[1], rel=1e-12)


def test_steady_rate_is_nan_without_a_window():
    assert math.isnan(steady_tok_s([], 2))
    assert math.isnan(steady_tok_s([[0.1, 2.0, 2.0, 0.0], [0.2, 4.0, 2.0, 2.0]], 2))  # one step
    assert steady_tok_s([[0.1, 1.0, 1.0, 0.0], [0.3, 3.0, 2.0, 0.0], [0.5, 7.0, 2.0, 0.0],
                         [0.7, 9.0, 2.0, 1.0]], 2) == pytest.approx(4.0 / 0.2)


def test_decode_rate_counts_steps_that_started_no_request():
    """The two steps where a request got its first token (prefill) are left out, the rest give tokens / seconds."""
    steps = [[1.0, 1, 1, 0], [1.5, 3, 1, 0], [3.0, 4, 2, 0], [3.5, 8, 2, 0], [4.0, 10, 2, 1]]
    assert decode_tok_s(steps) == pytest.approx((2 + 4 + 2) / (0.5 + 0.5 + 0.5))
    assert math.isnan(decode_tok_s([[1.0, 1, 1, 0]]))

