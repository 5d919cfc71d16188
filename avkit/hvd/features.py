"""Runtime features of a cache-draft candidate for the payoff predictor (HVD, docs/hvd.md).

Every feature at decode position t uses only what the runtime knows before verifying there:
the cache state over prompt + output[:t], the draft itself, and outcomes already decided by
output[:t]. Groups (ablated in `bench/results/hvd.md`):
  base       match_len, draft_len, score, mean/first/last path probability, global-tree source,
             log decode position, log prompt length
  history    over the last W positions t' < t: cache accepted length truncated to what output[:t]
             reveals, min(acc_c[t'], t - t'); cache first-token hit rate; model first-token hit rate
             (teacher-forced match); model accepted length truncated the same way
  structure  share of draft tokens (and class of the last context token) that are identifiers,
             whitespace, punctuation, digits, newlines (`avkit.hvd.token_classes`)
  copy       matched suffix + draft occurs verbatim in the prompt; in the output so far
"""

from __future__ import annotations

import numpy as np

from avkit.hvd.token_classes import CLASSES

FEATURE_GROUPS: dict[str, tuple[str, ...]] = {
    "base": ("match_len", "draft_len", "score", "mean_prob", "first_prob", "last_prob", "source_global",
             "log_position", "log_prompt_len"),
    "history": ("hist_cache_acc", "hist_cache_hit", "hist_model_hit", "hist_model_acc"),
    "structure": tuple(f"draft_{c}" for c in CLASSES) + tuple(f"ctx_{c}" for c in CLASSES),
    "copy": ("in_prompt", "in_output"),
}
ALL_FEATURES: tuple[str, ...] = tuple(n for g in FEATURE_GROUPS.values() for n in g)


def causal_window_mean(acc: np.ndarray, window: int, truncate: bool) -> np.ndarray:
    """[N] -> [N]: mean over t' in [t - window, t) of acc[t'] (truncated to t - t' when asked); 0 at t = 0.

    >>> causal_window_mean(np.array([3, 0, 2, 1]), window=2, truncate=True).tolist()
    [0.0, 1.0, 1.0, 0.5]
    """
    n = len(acc)
    total = np.zeros(n)
    count = np.zeros(n)
    for lag in range(1, window + 1):  # W vectorized shifts, not a loop over positions
        if lag >= n + 1:
            break
        src = acc[: n - lag].astype(np.float64)  # acc[t - lag] for t = lag..n-1
        total[lag:] += np.minimum(src, lag) if truncate else src
        count[lag:] += 1
    return np.divide(total, count, out=np.zeros(n), where=count > 0)


def history_features(cache_acc: np.ndarray, model_match: np.ndarray, model_acc: np.ndarray,
                     window: int) -> dict[str, np.ndarray]:
    """The `history` group for one generation ([N] each)."""
    return {
        "hist_cache_acc": causal_window_mean(cache_acc, window, truncate=True),
        "hist_cache_hit": causal_window_mean((cache_acc > 0).astype(np.float64), window, truncate=False),
        "hist_model_hit": causal_window_mean(model_match.astype(np.float64), window, truncate=False),
        "hist_model_acc": causal_window_mean(model_acc, window, truncate=True),
    }


def structure_features(draft_classes: np.ndarray, ctx_tokens: np.ndarray,
                       classes: np.ndarray | None) -> dict[str, np.ndarray]:
    """`draft_classes` [N, 5] shares over each draft's tokens; context classes from the last token."""
    n = len(ctx_tokens)
    ctx = classes[ctx_tokens] if classes is not None else np.zeros((n, len(CLASSES)), dtype=bool)  # [N, 5]
    out = {f"draft_{c}": draft_classes[:, i] for i, c in enumerate(CLASSES)}
    out.update({f"ctx_{c}": ctx[:, i].astype(np.float64) for i, c in enumerate(CLASSES)})
    return out


def feature_matrix(columns: dict[str, np.ndarray], names: tuple[str, ...]) -> np.ndarray:
    """[N, F] float32 in the order of `names`."""
    return np.stack([np.asarray(columns[n], dtype=np.float32) for n in names], axis=1)
