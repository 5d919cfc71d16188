"""Step rows from an aggregate acceptance profile (`avkit import vllm-metrics`) instead of a per-draft trace.

The profile gives P(L > j) = survival_j, so P(L = l) = s_{l-1} - s_l (s_{-1} = 1, s_K = 0); `profile_steps`
lays out `rows` step rows with exactly that distribution (largest-remainder counts, a fixed interleave), every
draft K slots. No features: only no-spec and fixed K can be replayed (`policies_for_profile`).
"""

from __future__ import annotations

import numpy as np

from avkit.errors import ConfigError, DataError
from avkit.jsonsafe import read_json
from avkit.sim.steps import StepTable


def read_profile(path) -> dict:
    profile = read_json(path, "--profile", DataError)
    if not isinstance(profile, dict) or profile.get("kind") != "aggregate" or "positions" not in profile:
        raise DataError(f"--profile {path}: not an aggregate acceptance profile (`avkit import vllm-metrics`)")
    return profile


def length_distribution(profile: dict) -> np.ndarray:
    """[K + 1] P(L = l) from the profile's survival."""
    s = np.array([p["survival"] for p in profile["positions"]], dtype=np.float64)  # [K]
    if s.size == 0 or not np.isfinite(s).all() or (np.diff(np.r_[1.0, s]) > 1e-12).any() or (s < 0).any():
        raise DataError(f"acceptance profile: survival {s.tolist()} must be finite, in [0, 1] and non-increasing")
    return np.r_[1.0, s] - np.r_[s, 0.0]


def profile_steps(profile: dict, rows: int = 20_000, steps_per_request: int = 64) -> StepTable:
    """A StepTable whose accepted lengths follow the profile exactly (module docstring)."""
    pmf = length_distribution(profile)  # [K + 1]
    k = pmf.size - 1
    exact = pmf * rows
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(-(exact - counts), kind="stable")[: rows - counts.sum()]] += 1  # largest remainder
    lengths = np.repeat(np.arange(k + 1), counts)  # [S]
    order = np.argsort((np.arange(rows) * 0.6180339887498949) % 1.0, kind="stable")  # golden-ratio interleave
    accepted = lengths[order]
    j = np.arange(k)
    label = np.where(j[None, :] < accepted[:, None], 1, np.where(j[None, :] == accepted[:, None], 0, -1))
    request = np.arange(rows) // steps_per_request
    ordinal = np.arange(rows) % steps_per_request
    full = np.full(rows, k, dtype=np.int64)
    return StepTable(request.astype(np.int64), ordinal.astype(np.int64), full, full.copy(),
                     accepted.astype(np.int64), label.astype(np.int8), {}, np.full(rows, -1, np.int64),
                     np.ones(rows, np.int64), np.full(rows, np.nan), k)


def policies_for_profile(specs: list[str] | None, k: int) -> list[str]:
    """No-spec and fixed K only (an aggregate has no features to adapt on)."""
    specs = specs or ["nospec", "fixed"]
    bad = [s for s in specs if not (s == "nospec" or s.startswith("fixed"))]
    if bad:
        raise ConfigError(f"--policy {bad[0]}: an aggregate acceptance profile (--profile) has no per-draft "
                          "features; only nospec and fixed[:K] can be simulated from it")
    return specs


__all__ = ["length_distribution", "policies_for_profile", "profile_steps", "read_profile"]
