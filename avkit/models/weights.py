"""Weights from a HF safetensors directory or a GGUF file, renamed and fused into avkit's layout.

Glossary
--------
HF names     ``model.layers.N.self_attn.q_proj.weight`` ... (the transformers checkpoint layout)
GGUF names   llama.cpp's ``blk.N.attn_q.weight`` ...; shapes are the same as HF once read by gguf-py
fused        avkit stores q|k|v as one ``attn.qkv`` matrix and gate|up as one ``mlp.gate_up`` matrix:
             one matmul instead of three (two), which matters on CPU at batch 1
permute      llama.cpp's converter reorders the rows of q/k for arch ``llama`` (rotary pairs interleaved);
             :func:`unpermute` undoes it. For ``qwen2`` it does not, so neither do we.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from avkit.errors import ModelError
from avkit.models.config import ModelConfig
from avkit.models.dequant import dequantize
from avkit.models.gguf_file import GGUFFile

# GGUF tensor name -> HF tensor name ("{i}" is the layer)
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
_HF_TO_GGUF = {v: k for k, v in GGUF_TO_HF.items()}
_LAYER = re.compile(r"\.(\d+)\.")


def gguf_name_to_hf(name: str) -> str | None:
    m = _LAYER.search(name)
    key = _LAYER.sub(".{i}.", name, count=1) if m else name
    hf = GGUF_TO_HF.get(key)
    return hf.format(i=m.group(1)) if hf and m else hf


def hf_name_to_gguf(name: str) -> str | None:
    m = _LAYER.search(name)
    key = _LAYER.sub(".{i}.", name, count=1) if m else name
    g = _HF_TO_GGUF.get(key)
    return g.format(i=m.group(1)) if g and m else g


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for arch llama: per head, rows (0, D/2, 1, D/2+1, ...)."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of :func:`permute_qk` (back to HF's rotate-half row order)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def fuse_hf_state(cfg: ModelConfig, tensors: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """HF-named tensors -> avkit's fused state dict (consumes ``tensors`` to keep peak memory low)."""

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise ModelError(f"{source}: missing tensor {name}")
        return tensors.pop(name)

    out = {"embed.weight": take("model.embed_tokens.weight"), "norm.weight": take("model.norm.weight")}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = take("lm_head.weight")
    for i in range(cfg.num_layers):
        hf, av = f"model.layers.{i}.", f"layers.{i}."
        out[av + "attn_norm.weight"] = take(hf + "input_layernorm.weight")
        out[av + "mlp_norm.weight"] = take(hf + "post_attention_layernorm.weight")
        out[av + "attn.qkv.weight"] = torch.cat([take(hf + f"self_attn.{p}_proj.weight") for p in "qkv"])
        if cfg.qkv_bias:
            out[av + "attn.qkv.bias"] = torch.cat([take(hf + f"self_attn.{p}_proj.bias") for p in "qkv"])
        out[av + "attn.o.weight"] = take(hf + "self_attn.o_proj.weight")
        out[av + "mlp.gate_up.weight"] = torch.cat([take(hf + "mlp.gate_proj.weight"),
                                                    take(hf + "mlp.up_proj.weight")])
        out[av + "mlp.down.weight"] = take(hf + "mlp.down_proj.weight")
    return out


def read_hf_dir(path: Path, dtype: torch.dtype) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """``config.json`` + ``*.safetensors`` -> (config, HF-named tensors in ``dtype``)."""
    from safetensors.torch import load_file  # lazy: safetensors

    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{path}: not a model directory (no config.json)")
    cfg = ModelConfig.from_hf(json.loads(cfg_path.read_text()), source=str(cfg_path))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{path}: no *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update({k: v.to(dtype) for k, v in load_file(str(f)).items()})
    if "lm_head.weight" in tensors and cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight")
    return cfg, tensors


def _iter_gguf_tensors(f, arch: str, heads: int, kv_heads: int, dtype) -> Iterator[tuple[str, torch.Tensor]]:
    for t in f.tensors.values():
        name = gguf_name_to_hf(t.name)
        if name is None:
            continue  # a tensor the forward has no use for
        w = dequantize(f.raw(t), t.ggml_type, t.shape)
        if arch == "llama" and ".attn_q." in t.name:
            w = torch.from_numpy(unpermute_qk(w.numpy(), heads).copy())
        elif arch == "llama" and ".attn_k." in t.name:
            w = torch.from_numpy(unpermute_qk(w.numpy(), kv_heads).copy())
        yield name, w.to(dtype)


def read_gguf(path: Path, dtype: torch.dtype) -> tuple[ModelConfig, dict[str, torch.Tensor], GGUFFile]:
    """A GGUF file -> (config, HF-named dequantized tensors, the parsed file for the tokenizer)."""
    f = GGUFFile(path)
    names = f.tensors
    arch = f.metadata.get("general.architecture")
    if arch not in ("llama", "qwen2"):
        raise ModelError(f"{path}: unsupported GGUF architecture {arch!r} (supported: llama, qwen2)")
    if "token_embd.weight" not in names:
        raise ModelError(f"{path}: GGUF has no token_embd.weight")
    if "rope_freqs.weight" in names or f.metadata.get(f"{arch}.rope.scaling.type", "none") != "none":
        raise ModelError(f"{path}: RoPE scaling (e.g. Llama 3.1's rope_freqs) is not supported")
    vocab = int(names["token_embd.weight"].shape[0])
    cfg = ModelConfig.from_gguf(f.metadata, vocab_size=vocab, tied="output.weight" not in names,
                                qkv_bias="blk.0.attn_q.bias" in names, source=str(path))
    tensors = dict(_iter_gguf_tensors(f, cfg.arch, cfg.num_heads, cfg.num_kv_heads, dtype))
    return cfg, tensors, f
