"""How one request samples (a request's own settings; the engine applies them per row)."""

from __future__ import annotations

from dataclasses import dataclass

from avkit.validate import in_range


@dataclass(frozen=True)
class SamplingConfig:
    """How one request samples: temperature 0 means greedy; top_k 0 and min_p 0 are off."""

    temperature: float = 1.0
    top_p: float = 0.95
    max_new_tokens: int = 256
    seed: int | None = None
    top_k: int = 0  # keep the k most probable tokens (ties at the k-th kept)
    min_p: float = 0.0  # keep tokens with probability >= min_p * the most probable one's

    def __post_init__(self):
        in_range(self, "temperature", 0.0)
        in_range(self, "top_p", 0.0, 1.0, lo_open=True)
        in_range(self, "max_new_tokens", 1)
        in_range(self, "top_k", 0)
        in_range(self, "min_p", 0.0, 1.0)


__all__ = ["SamplingConfig"]
