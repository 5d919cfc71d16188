"""From a simulated table to a schedule (the tests check each rule against a brute-force loop):
  choice      per concurrency, the candidate of highest throughput among those whose p90 TPOT meets the SLO
              (ties: the smaller K); none meets it: flagged, the lowest-TPOT arm named
  ranges      batch size b takes the choice of the concurrency nearest on a log scale (boundary
              floor(sqrt(c_i c_(i+1))), from 1 to the last concurrency or the KV cache's most requests when a
              larger one is infeasible), equal neighbours merged
  single K    the fixed arm of highest mean log throughput (a deployment without a schedule)
"""

from __future__ import annotations

import math
from itertools import pairwise
from dataclasses import dataclass

import numpy as np

from avkit.tune.arms import Arm, Cell


@dataclass(frozen=True)
class Choice:
    concurrency: int
    arm: Arm
    meets_slo: bool  # False: no candidate met the SLO here (the lowest-TPOT arm is named)


def choose(cells: dict[tuple[str, int], Cell], candidates: list[Arm], concurrency: list[int],
           slo_ms: float = 0.0) -> list[Choice]:
    """The choice rule above, at each concurrency in `concurrency`."""
    out = []
    for c in concurrency:
        here = [cells[a.name, c] for a in candidates]
        thr = np.array([x.throughput for x in here])  # [A]
        tpot = np.array([x.p90_tpot_ms for x in here])  # [A]
        ok = np.array([x.meets(slo_ms) for x in here])  # [A]
        if ok.any():
            out.append(Choice(c, candidates[int(np.argmax(np.where(ok, thr, -np.inf)))], True))
        else:
            out.append(Choice(c, candidates[int(np.argmin(tpot))], False))
    return out


def ranges(concurrency: list[int], values: list, last_hi: int = 0) -> list[tuple[int, int, object]]:
    """Inclusive batch-size ranges (lo, hi, value) from values at sorted concurrencies, merged; the last
    range ends at max(last concurrency, last_hi).

    Examples
    --------
    >>> ranges([1, 2, 4, 8, 16], [7, 7, 5, 5, 0])
    [(1, 2, 7), (3, 11, 5), (12, 16, 0)]
    """
    assert list(concurrency) == sorted(set(concurrency)) and len(values) == len(concurrency)
    his = [math.isqrt(a * b) for a, b in pairwise(concurrency)] + [max(concurrency[-1], last_hi)]
    out: list[tuple[int, int, object]] = []
    lo = 1
    for hi, value in zip(his, values):
        if out and out[-1][2] == value:
            out[-1] = (out[-1][0], hi, value)
        else:
            out.append((lo, hi, value))
        lo = hi + 1
    return out


def single_best(cells: dict[tuple[str, int], Cell], fixed: list[Arm], concurrency: list[int]) -> Arm:
    """The fixed arm with the highest mean log throughput over `concurrency`."""
    score = [np.mean([np.log(cells[a.name, c].throughput) for c in concurrency]) for a in fixed]
    return fixed[int(np.argmax(score))]
