"""Models: load a Llama / Qwen2 checkpoint (HF directory or GGUF) into avkit's compact forward.

``load(path_or_id)`` -> :class:`LoadedModel` (model, tokenizer, model_id, sha256). The model's
``forward(tokens, q_lens, slots, cache, logits)`` appends a different number of tokens per row to a
slot-based KV cache (``model.new_cache(max_batch, max_len)``) and returns float32 logits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from avkit.errors import ModelError
from avkit.models.config import ModelConfig
from avkit.models.fetch import weights_sha256
from avkit.models.kv_cache import KVCache
from avkit.models.registry import resolve
from avkit.models.tokenizer import Tokenizer
from avkit.models.transformer import HostLengths, Transformer
from avkit.models.weights import fuse_hf_state, read_gguf, read_hf_dir


@dataclass(frozen=True)
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer
    model_id: str  # what the caller asked for (alias, HF id or path)
    sha256: str  # of the GGUF file, or of the safetensors files in name order


def load(path_or_id: str | os.PathLike, dtype: torch.dtype = torch.float32,
         device: str | torch.device = "cpu") -> LoadedModel:
    """Resolve ``path_or_id`` (path, alias such as ``qwen2.5-coder-1.5b``, or cached HF id) and load it.

    >>> m = load("qwen2.5-coder-0.5b")  # doctest: +SKIP
    >>> m.model.config.num_layers  # doctest: +SKIP
    24
    """
    path = resolve(path_or_id)
    if path.is_dir():
        cfg, tensors = read_hf_dir(path, dtype)
        tokenizer = Tokenizer.from_dir(path)
        digest = weights_sha256(path)
    elif path.suffix == ".gguf":
        cfg, tensors, gguf_file = read_gguf(path, dtype)
        tokenizer = Tokenizer.from_gguf(gguf_file.metadata, str(path))
        digest = weights_sha256(path)
    else:
        raise ModelError(f"{path}: expected a model directory or a .gguf file")
    state = fuse_hf_state(cfg, tensors, str(path))
    with torch.device("meta"):
        model = Transformer(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    model = model.to(device).eval().requires_grad_(False)
    model.pack_for_cpu()  # CPU + bf16: pre-packed weights for the AVX2 kernel (no-op elsewhere)
    return LoadedModel(model, tokenizer, str(path_or_id), digest)


__all__ = ["HostLengths", "KVCache", "LoadedModel", "ModelConfig", "Tokenizer", "Transformer", "load"]
