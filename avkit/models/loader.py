"""Checkpoints -> a :class:`LoadedModel`: a HF directory (``config.json``, ``*.safetensors``, ``tokenizer.json``)
or a GGUF file (gguf_file.py parses the format), each read to (config, tensor by name, tokenizer). avkit stores
q|k|v as one ``attn.qkv`` matrix and gate|up as one ``mlp.gate_up`` matrix (one matmul instead of three, which
matters on CPU at batch 1).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from avkit.errors import ConfigError, ModelError
from avkit.jsonsafe import read_json
from avkit.models.config import ModelConfig
from avkit.models.gguf_file import GGUFFile, dequantize, unpermute_qk
from avkit.models.registry import resolve, weights_sha256
from avkit.models.tokenizer import Tokenizer
from avkit.models.transformer import Transformer

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
        (cfg, take, tokenizer), column = read_hf_dir(path), 0
    elif path.suffix == ".gguf":
        (cfg, take, tokenizer), column = read_gguf(path), 1
    else:
        raise ModelError(f"{path}: expected a model directory or a .gguf file")
    with torch.device("meta"):
        model = Transformer(cfg)
    state = {}
    for name in model.state_dict():  # what this config needs: lm_head only untied, qkv.bias only with biases
        layer = re.match(r"layers\.(\d+)\.", name)
        key = name if layer is None else "layers.{i}." + name[layer.end():]
        try:  # each tensor is taken once: a HF directory's memory is freed as the state dict fills
            parts = [take(part[column].format(i=layer and layer[1])).to(dtype) for part in TENSORS[key]]
        except KeyError as e:
            raise ModelError(f"{path}: missing tensor {e.args[0]}") from None
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


def load_pair(models, *, drafts: bool = True, target: LoadedModel | None = None,
              draft: LoadedModel | None = None) -> tuple[LoadedModel, LoadedModel | None]:
    """The target and the draft `models` (a config.ModelsConfig, not imported: config reaches models through
    features) names, on its device and dtype (a model given is used as it is); the draft
    is None when `models` has none or the run does not draft (`drafts`: k > 0)."""
    device, dtype = placement(models.device, models.dtype)
    target = target if target is not None else load(models.target, dtype=dtype, device=device)
    if not (drafts and models.has_draft):
        return target, None
    return target, draft if draft is not None else load(models.draft, dtype=dtype, device=device)


def read_hf_dir(path: Path) -> tuple[ModelConfig, Callable[[str], torch.Tensor], Tokenizer]:
    """``config.json`` + ``*.safetensors`` -> (config, HF tensor name -> tensor as stored, popped, tokenizer)."""
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{path}: not a model directory (no config.json)")
    cfg = ModelConfig.from_hf(read_json(cfg_path, error=ModelError), source=str(cfg_path))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{path}: no *.safetensors weights")
    tensors = {k: v for f in files for k, v in load_file(str(f)).items()}
    return cfg, tensors.pop, Tokenizer.from_dir(path)


def read_gguf(path: Path) -> tuple[ModelConfig, Callable[[str], torch.Tensor], Tokenizer]:
    """A GGUF file -> (config, GGUF tensor name -> float32 tensor dequantized on demand, tokenizer)."""
    f = GGUFFile(path)
    names = f.tensors
    arch = f.metadata.get("general.architecture")
    if arch not in ("llama", "qwen2"):
        raise ModelError(f"{path}: unsupported GGUF architecture {arch!r} (supported: llama, qwen2)")
    if "token_embd.weight" not in names:
        raise ModelError(f"{path}: GGUF has no token_embd.weight")
    if "rope_freqs.weight" in names or f.metadata.get(f"{arch}.rope.scaling.type", "none") != "none":
        raise ModelError(f"{path}: RoPE scaling (e.g. Llama 3.1's rope_freqs) is not supported")

    def get(key, default=None):
        v = f.metadata.get(f"{arch}.{key}", default)
        if v is None:
            raise ModelError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return v

    heads, hidden = int(get("attention.head_count")), int(get("embedding_length"))
    cfg = replace(ModelConfig.from_hf({  # GGUF key/values as the HF config.json keys
        "model_type": arch, "vocab_size": int(names["token_embd.weight"].shape[0]), "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")), "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads, "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)), "rope_theta": float(get("rope.freq_base", 1e4)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "tie_word_embeddings": "output.weight" not in names}, source=str(path)), qkv_bias="blk.0.attn_q.bias" in names)

    def take(name: str) -> torch.Tensor:
        t = names[name]  # KeyError: a missing tensor
        w = dequantize(f.raw(t), t.ggml_type, t.shape)
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            n_heads = cfg.num_heads if ".attn_q." in name else cfg.num_kv_heads
            w = torch.from_numpy(unpermute_qk(w.numpy(), n_heads).copy())
        return w

    return cfg, take, Tokenizer.from_gguf(f.metadata, str(path))
