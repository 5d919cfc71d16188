"""The batch fit's IRLS pass (estimators/irls.py) against the predict-then-sum pass it replaced, and
the hashed duplicate-slot prefilter of the trace reader."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from avkit.estimators.base import sigmoid
from avkit.estimators.irls import BLOCK, fused_segment_stats
from avkit.trace.values import SLOT_KEY, _may_repeat_a_slot


def segment_stats(f: np.ndarray, f2: np.ndarray, y: np.ndarray, p: np.ndarray) -> tuple[float, ...]:
    """The oracle: (a, b, c, g0, g1) of one position's rows ([n] each, f2 = f*f) at predictions p, plain
    numpy dots."""
    w = p * (1.0 - p)
    r = y - p
    return float(np.dot(w, f2)), float(np.dot(w, f)), float(w.sum()), float(np.dot(r, f)), float(r.sum())


@pytest.mark.parametrize("seed", range(3))
def test_fused_pass_equals_the_numpy_pass(seed):
    rng = np.random.default_rng(seed)
    n = 2 * BLOCK + 12_345  # blocks, and a partial last one
    f = rng.normal(1.0, 4.0, n) * (1 + 30 * (rng.random(n) < 0.01))  # a few far tails: p of 0 and 1
    y = (rng.random(n) < 0.6).astype(np.float64)
    slope, intercept = rng.uniform(0, 2), rng.normal()
    want = segment_stats(f, f * f, y, sigmoid(slope * f + intercept))  # the oracle: tanh logistic, numpy dots
    got = fused_segment_stats(f, y, slope, intercept)  # exp logistic, blocked gemv
    # the same sums up to rounding: n terms of size <= max |f|^2, each within a few ulps
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * n * float(np.max(f * f)))


def _slots(n: int, dup: tuple[int, int] | None = None) -> pl.DataFrame:
    rid = [f"r{i // 7}" for i in range(n)]
    pos = [i % 7 for i in range(n)]
    if dup:
        rid[dup[1]], pos[dup[1]] = rid[dup[0]], pos[dup[0]]
    return pl.DataFrame({"run_id": ["a"] * n, "request_id": rid, "drafter": ["model"] * n, "step": [3] * n,
                         "position": pos}).with_columns(pl.col("run_id", "request_id", "drafter").cast(pl.Categorical))


def test_duplicate_prefilter_passes_unique_slots_and_catches_every_repeat():
    assert list(_slots(10).columns) == list(SLOT_KEY)
    assert not _may_repeat_a_slot(_slots(70_000))
    for pair in [(0, 1), (5, 69_999), (30_000, 2)]:
        assert _may_repeat_a_slot(_slots(70_000, pair)), pair
