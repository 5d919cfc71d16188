"""Calibration health of an acceptance predictor inside vLLM: predicted vs observed, per position and rolling.

Runs in vLLM's worker (plugin.py feeds it every verified request-step) and hands its state to the stat
logger in vLLM's API server process (stat_logger.py) through one small JSON file, replaced atomically after
each engine step: the two live in different processes and vLLM's own stats objects have no room for it.
Glossary (a labelled slot: verified, at or before the first rejection; docs/estimator.md):
  p        the predictor's acceptance probability of a slot: sigmoid(slope * logit_qmax + intercept_j),
           vLLM's OnlineAcceptanceEstimator model with the coefficients the plugin was given
  y        1 if accepted, 0 if rejected
  expected accepted tokens of a request-step: sum_j prod_{i <= j} p_i over its verified slots (the survival
           the predictor implies); actual: vLLM's accepted length
  Brier    mean (p - y)^2; ECE: sum_b (n_b / n) |mean_b p - mean_b y| over BINS equal-width bins of p
           (avkit/metrics/calibration.py `ece_from_bins`, from the bins' sums)
  cumulative counters since start; rolling: the last WINDOW engine steps (a ring of per-step sums)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from avkit.estimators.base import sigmoid
from avkit.metrics.calibration import additive_sums, ece_from_bins
from avkit.staged import staged_file

BINS = 10
WINDOW = 100  # engine steps, vLLM's REFIT_INTERVAL: the span its online estimator refits on
STATE_FILE = "health.json"


class Health:
    """Per-step sums of labelled slots; `state()` is the JSON the stat logger reads."""

    def __init__(self, k: int, slope: float, intercepts: list[float]):
        self.k, self.slope, self.intercepts = k, float(slope), np.asarray(intercepts, dtype=np.float64)  # [K]
        width = 3 * k + 3 * BINS + 4  # one step's sums, laid out by add_step
        self.ring = np.zeros((WINDOW, width))  # [WINDOW, width]
        self.total = np.zeros(width)  # [width] since start
        self.steps = 0

    def predict(self, logit_qmax: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """[N] feature, [N] position -> [N] acceptance probability."""
        return sigmoid(self.slope * logit_qmax + self.intercepts[positions])

    def add_step(self, feature: np.ndarray, positions: np.ndarray, verified: np.ndarray, accepted: np.ndarray,
                 first: np.ndarray) -> None:
        """One engine step's slots, [N] each: logit_qmax, position, verified, label (-1: censored), and
        whether the slot starts its request-step (positions run 0..K-1 within a request-step)."""
        p = self.predict(feature, positions)  # [N]
        labelled = accepted >= 0
        y = np.where(labelled, accepted, 0).astype(np.float64)
        # [3, K, BINS] labelled slots, sum p, sum y by position and bin: the ECE's binning rule
        table = additive_sums(p[labelled], y[labelled], positions[labelled], 1, self.k, BINS)[1][:, 0]
        group = np.cumsum(first) - 1  # [N] request-step index
        logp = np.where(verified, np.log(np.maximum(p, 1e-300)), 0.0)
        c = np.cumsum(logp)
        starts = np.flatnonzero(first)
        seg = c - (c[starts] - logp[starts])[group]  # [N] sum_{i <= j} log p_i within the request-step
        survival = np.where(verified, np.exp(seg), 0.0)  # [N] prod_{i <= j} p_i within the request-step
        expected = float(survival.sum())
        actual = float(((accepted == 1) & verified).sum())
        brier = float(((p[labelled] - y[labelled]) ** 2).sum())
        sums = np.concatenate([*table.sum(-1), *table.sum(1), [brier, expected, actual, float(first.sum())]])
        self.total += sums
        self.ring[self.steps % WINDOW] = sums
        self.steps += 1

    def _view(self, sums: np.ndarray) -> dict:
        k = self.k
        counts, pred, acc = sums[:k], sums[k:2 * k], sums[2 * k:3 * k]
        bins = sums[3 * k:3 * k + 3 * BINS].reshape(3, BINS)
        brier, expected, actual, drafts = sums[3 * k + 3 * BINS:]
        n = counts.sum()
        with np.errstate(invalid="ignore", divide="ignore"):
            ece = float(ece_from_bins(bins)) if n else float("nan")
            return {"labelled": counts.tolist(), "accepted": acc.tolist(),
                    "predicted": (pred / counts).tolist(), "observed": (acc / counts).tolist(),
                    "brier": brier / n if n else float("nan"), "ece": ece,
                    "expected_accepted_per_step": expected / drafts if drafts else float("nan"),
                    "actual_accepted_per_step": actual / drafts if drafts else float("nan"),
                    "expected_accepted": expected, "actual_accepted": actual, "drafts": drafts}

    def state(self) -> dict:
        return {"k": self.k, "steps": self.steps, "total": self._view(self.total),
                "rolling": self._view(self.ring.sum(axis=0))}

    def publish(self, run_dir: Path) -> None:
        """Replace `run_dir`/health.json with the state (a reader never sees a torn file)."""
        with staged_file(run_dir / STATE_FILE, "health") as tmp:
            tmp.write_text(json.dumps(self.state()))


def read_state(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
