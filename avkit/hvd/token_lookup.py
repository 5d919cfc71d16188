"""Which vocabulary gives the payoff predictor its token-structure features, found once and said aloud.

The structure indicators (avkit/hvd/token_classes.py) need the target's vocabulary. In order:
  1. an explicit `--tokenizer` (a model path or alias; a failure is an error: it was asked for;
     `none` leaves the features out on purpose)
  2. the target named in the trace's metadata (`avkit.target`), when its files are local
  3. a class table shipped with avkit for that exact target (`avkit/hvd/classes/<sha256[:16]>.npz`,
     keyed by the trace's `avkit.target_sha256`): the shipped traces replay the same with or
     without `avkit models fetch`
  4. none: the features are left out, and `source` says so and how to add them (the CLI prints it;
     the payoff scores differ, e.g. 0.949/0.885 instead of 0.981/0.913 precision/recall)
A shipped table is `np.packbits` of the [V, 5] bool table, written by `save_shipped`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avkit.errors import ModelError
from avkit.hvd.token_classes import CLASSES, class_table_for

SHIPPED = Path(__file__).parent / "classes"


@dataclass(frozen=True)
class TokenClasses:
    table: np.ndarray | None  # [V, len(CLASSES)] bool, None: structure features left out
    source: str  # where the table came from, or why there is none (shown by the CLI and the report)


def shipped_path(target_sha256: str) -> Path:
    return SHIPPED / f"{target_sha256[:16]}.npz"


def load_shipped(target_sha256: str) -> np.ndarray | None:
    p = shipped_path(target_sha256)
    if not target_sha256 or not p.is_file():
        return None
    with np.load(p) as z:
        return np.unpackbits(z["bits"], axis=0, count=int(z["vocab"]))[:, : len(CLASSES)].astype(bool)


def save_shipped(model: str, target_sha256: str) -> Path:
    """Write the class table of `model` (path or alias) for traces whose target has this sha256."""
    table = class_table_for(model)  # [V, 5]
    SHIPPED.mkdir(exist_ok=True)
    p = shipped_path(target_sha256)
    np.savez_compressed(p, bits=np.packbits(table, axis=0), vocab=np.int64(table.shape[0]))
    return p


def token_classes_for(paths, tokenizer: str | None = None) -> TokenClasses:
    """The structure table for traces `paths` (the first one's target decides), see the module docstring."""
    from avkit.models.registry import resolve  # lazy: torch (avkit.models)
    from avkit.trace.reader import trace_metadata  # lazy: polars

    if tokenizer == "none":
        return TokenClasses(None, "--tokenizer none: token-structure features left out")
    if tokenizer:
        return TokenClasses(class_table_for(tokenizer), f"--tokenizer {tokenizer}")
    meta = trace_metadata(paths[0]) if paths else {}  # a missing or bad file is named
    target, sha = meta.get("avkit.target", ""), meta.get("avkit.target_sha256", "")
    if target:
        try:
            path = resolve(target)
            return TokenClasses(class_table_for(path), f"the trace's target {target} ({path})")
        except ModelError:
            pass
    shipped = load_shipped(sha)
    if shipped is not None:
        return TokenClasses(shipped, f"the class table shipped for target {target or '?'} "
                                     f"(sha256 {sha[:12]}…, {shipped_path(sha).name})")
    what = f"target {target!r}" if target else "the traces (no avkit.target in their metadata)"
    return TokenClasses(None, f"no vocabulary for {what}: token-structure features LEFT OUT, so the payoff "
                              "scores differ; `avkit models fetch` or --tokenizer PATH adds them")


__all__ = ["TokenClasses", "load_shipped", "save_shipped", "token_classes_for"]
