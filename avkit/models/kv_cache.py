"""KV cache with one slot (row) per concurrent request: preallocated, with per-slot valid lengths (positions
past ``lengths[slot]`` are garbage); rejected drafts roll back by truncating a length, never growing it.
"""

from __future__ import annotations

import torch

from avkit.errors import ConfigError


class KVCache:
    """Keys and values of every layer: ``k[layer]`` is ``[max_batch, n_kv_heads, max_len, head_dim]``."""

    def __init__(self, num_layers: int, max_batch: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if max_batch < 1 or max_len < 1:
            raise ConfigError(f"KV cache needs max_batch >= 1 and max_len >= 1, got {max_batch}, {max_len}")
        shape = (num_layers, max_batch, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, H_kv, T, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, H_kv, T, D]
        self.lengths = torch.zeros(max_batch, dtype=torch.int64, device=device)  # [max_batch]
        self.max_batch = max_batch
        self.max_len = max_len

    @torch.inference_mode()
    def truncate(self, slots: torch.Tensor, lengths: torch.Tensor) -> None:
        """Roll back: ``lengths[slots] = min(lengths[slots], lengths)`` (a roll back never grows a slot; no host
        read). slots [B] int64, lengths [B] int64 >= 0."""
        self.lengths[slots] = torch.minimum(self.lengths[slots], lengths.to(self.lengths.device))

    @torch.inference_mode()
    def free(self, slot: int) -> None:
        """Forget everything in one slot (the request left the batch)."""
        self.lengths[int(slot)] = 0

    def append(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, src: torch.Tensor | None,
               k: torch.Tensor, v: torch.Tensor) -> None:
        """``k[b, src[b, s]]`` (``src`` None: ``k[b, s]``) to position ``positions[b, s]`` of slot ``slots[b]``; pads
        point at their row's last real token and rewrite its value (no data-dependent shapes).
        slots [B], positions [B, S] absolute, src [B, S] or None, k/v [B, S, H_kv, D]."""
        if src is not None:
            idx = src[:, :, None, None].expand_as(k)  # [B, S, H_kv, D]
            k, v = k.gather(1, idx), v.gather(1, idx)
        rows = slots[:, None].expand_as(positions)  # [B, S]
        self.k[layer][rows, :, positions] = k  # [B, S, H_kv, D]
        self.v[layer][rows, :, positions] = v
