"""Models: load a Llama / Qwen2 checkpoint (HF directory or GGUF) into avkit's compact forward.

``load(path_or_id)`` -> :class:`LoadedModel`. avkit stores q|k|v as one ``attn.qkv`` matrix and gate|up as one
``mlp.gate_up`` matrix (one matmul instead of three, which matters on CPU at batch 1).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
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


# avkit's state-dict name -> its parts, concatenated on dim 0: (HF name, llama.cpp GGUF name); {i} is the layer
_L, _B = "model.layers.{i}.", "blk.{i}."
TENSORS = {
    "embed.weight": [("model.embed_tokens.weight", "token_embd.weight")],
    "norm.weight": [("model.norm.weight", "output_norm.weight")],
    "lm_head.weight": [("lm_head.weight", "output.weight")],
    "layers.{i}.attn_norm.weight": [(_L + "input_layernorm.weight", _B + "attn_norm.weight")],
    "layers.{i}.mlp_norm.weight": [(_L + "post_attention_layernorm.weight", _B + "ffn_norm.weight")],
    **{f"layers.{{i}}.attn.qkv.{w}": [(f"{_L}self_attn.{p}_proj.{w}", f"{_B}attn_{p}.{w}") for p in "qkv"]
       for w in ("weight", "bias")},
    "layers.{i}.attn.o.weight": [(_L + "self_attn.o_proj.weight", _B + "attn_output.weight")],
    "layers.{i}.mlp.gate_up.weight": [(_L + "mlp.gate_proj.weight", _B + "ffn_gate.weight"),
                                      (_L + "mlp.up_proj.weight", _B + "ffn_up.weight")],
    "layers.{i}.mlp.down.weight": [(_L + "mlp.down_proj.weight", _B + "ffn_down.weight")],
}


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
        (cfg, take), column, tokenizer = read_hf_dir(path), 0, Tokenizer.from_dir(path)
    elif path.suffix == ".gguf":
        cfg, take, gguf_file = read_gguf(path)
        column, tokenizer = 1, Tokenizer.from_gguf(gguf_file.metadata, str(path))
    else:
        raise ModelError(f"{path}: expected a model directory or a .gguf file")
    with torch.device("meta"):
        model = Transformer(cfg)
    state = {}
    for name in model.state_dict():  # what this config needs: lm_head only untied, qkv.bias only with biases
        layer = re.match(r"layers\.(\d+)\.", name)
        key = name if layer is None else "layers.{i}." + name[layer.end():]
        parts = [take(part[column].format(i=layer and layer[1])).to(dtype) for part in TENSORS[key]]
        state[name] = parts[0] if len(parts) == 1 else torch.cat(parts)
    model.load_state_dict(state, strict=True, assign=True)
    model = model.to(device).eval().requires_grad_(False)
    model.pack_for_cpu()  # CPU + bf16: pre-packed weights for the AVX2 kernel (no-op elsewhere)
    return LoadedModel(model, tokenizer, str(path_or_id), weights_sha256(path))


def placement(device: str = "auto", dtype: str = "auto") -> tuple[torch.device, torch.dtype]:
    """(torch.device, torch.dtype) from names ``ModelsConfig`` checked: auto is cuda when torch sees a GPU, else cpu;
    bfloat16 on a GPU, float32 on a CPU. A cuda device torch cannot see is an error."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: torch sees no CUDA GPU on this machine (use --device cpu)")
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "bfloat16"
    return torch.device(device), getattr(torch, dtype)


def read_hf_dir(path: Path) -> tuple[ModelConfig, Callable[[str], torch.Tensor]]:
    """``config.json`` + ``*.safetensors`` -> (config, HF tensor name -> tensor as stored, each taken once)."""
    from safetensors.torch import load_file  # lazy: safetensors

    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{path}: not a model directory (no config.json)")
    cfg = ModelConfig.from_hf(read_json(cfg_path, error=ModelError), source=str(cfg_path))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{path}: no *.safetensors weights")
    tensors = {k: v for f in files for k, v in load_file(str(f)).items()}

    def take(name: str) -> torch.Tensor:  # popped: memory is freed as the state dict fills
        if name not in tensors:
            raise ModelError(f"{path}: missing tensor {name}")
        return tensors.pop(name)

    return cfg, take


__all__ = ["HostLengths", "KVCache", "LoadedModel", "ModelConfig", "Tokenizer", "Transformer", "load", "placement"]
