"""Models: load a Llama / Qwen2 checkpoint (HF directory or GGUF) into avkit's compact forward.

``load(path_or_id)`` -> :class:`LoadedModel`. avkit stores q|k|v as one ``attn.qkv`` matrix and gate|up as one
``mlp.gate_up`` matrix (one matmul instead of three, which matters on CPU at batch 1). Placement "auto": cuda
when torch sees a GPU, else cpu; bfloat16 on a GPU, float32 on a CPU (bfloat16 there is ~3x faster on
AVX512-BF16 cores and is what the shipped traces were recorded with).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from avkit.errors import ConfigError, ModelError
from avkit.jsonsafe import read_json
from avkit.models.config import ModelConfig
from avkit.models.gguf_file import read_gguf
from avkit.models.kv_cache import KVCache
from avkit.models.registry import resolve, weights_sha256
from avkit.models.tokenizer import Tokenizer
from avkit.models.transformer import HostLengths, Transformer
from avkit.validate import check_placement


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
    elif path.suffix == ".gguf":
        cfg, tensors, gguf_file = read_gguf(path, dtype)
        tokenizer = Tokenizer.from_gguf(gguf_file.metadata, str(path))
    else:
        raise ModelError(f"{path}: expected a model directory or a .gguf file")
    state = fuse_hf_state(cfg, tensors, str(path))
    with torch.device("meta"):
        model = Transformer(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    model = model.to(device).eval().requires_grad_(False)
    model.pack_for_cpu()  # CPU + bf16: pre-packed weights for the AVX2 kernel (no-op elsewhere)
    return LoadedModel(model, tokenizer, str(path_or_id), weights_sha256(path))


def placement(device: str = "auto", dtype: str = "auto") -> tuple[torch.device, torch.dtype]:
    """(torch.device, torch.dtype) from names; an explicit cuda device on a machine without one is an error."""
    check_placement(device, dtype)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: torch sees no CUDA GPU on this machine (use --device cpu)")
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "bfloat16"
    return torch.device(device), getattr(torch, dtype)


def read_hf_dir(path: Path, dtype: torch.dtype) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """``config.json`` + ``*.safetensors`` -> (config, HF-named tensors in ``dtype``)."""
    from safetensors.torch import load_file  # lazy: safetensors

    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{path}: not a model directory (no config.json)")
    cfg = ModelConfig.from_hf(read_json(cfg_path, error=ModelError), source=str(cfg_path))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{path}: no *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update({k: v.to(dtype) for k, v in load_file(str(f)).items()})
    if "lm_head.weight" in tensors and cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight")
    return cfg, tensors


def fuse_hf_state(cfg: ModelConfig, tensors: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """HF-named tensors -> avkit's fused state dict (consumes ``tensors`` to keep peak memory low)."""

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise ModelError(f"{source}: missing tensor {name}")
        return tensors.pop(name)

    def cat(names) -> torch.Tensor:
        return torch.cat([take(hf + n) for n in names])

    out = {"embed.weight": take("model.embed_tokens.weight"), "norm.weight": take("model.norm.weight")}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = take("lm_head.weight")
    for i in range(cfg.num_layers):
        hf, av = f"model.layers.{i}.", f"layers.{i}."
        out[av + "attn_norm.weight"] = take(hf + "input_layernorm.weight")
        out[av + "mlp_norm.weight"] = take(hf + "post_attention_layernorm.weight")
        out[av + "attn.qkv.weight"] = cat(f"self_attn.{p}_proj.weight" for p in "qkv")
        if cfg.qkv_bias:
            out[av + "attn.qkv.bias"] = cat(f"self_attn.{p}_proj.bias" for p in "qkv")
        out[av + "attn.o.weight"] = take(hf + "self_attn.o_proj.weight")
        out[av + "mlp.gate_up.weight"] = cat(("mlp.gate_proj.weight", "mlp.up_proj.weight"))
        out[av + "mlp.down.weight"] = take(hf + "mlp.down_proj.weight")
    return out


__all__ = ["HostLengths", "KVCache", "LoadedModel", "ModelConfig", "Tokenizer", "Transformer", "load", "placement"]
