"""ModelConfig: the shape of a Llama / Qwen2 decoder (Qwen2 = Llama + q/k/v biases), read from HF ``config.json``
(GGUF: gguf_file.py maps its metadata to the same keys). GQA: num_heads / num_kv_heads query heads share one
key/value head; head_dim = hidden_size / num_heads unless the config says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from avkit.errors import ModelError

# HF ``architectures[0]`` / ``model_type`` / GGUF ``general.architecture`` -> avkit arch
ARCHITECTURES = {"LlamaForCausalLM": "llama", "llama": "llama", "Qwen2ForCausalLM": "qwen2", "qwen2": "qwen2"}


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False

    def __post_init__(self):
        if self.arch not in ("llama", "qwen2"):
            raise ModelError(f"arch: unsupported architecture {self.arch!r} (supported: llama, qwen2)")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ModelError(f"model config {name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelError(f"model config num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> ModelConfig:
        """Build from a HF ``config.json`` dict; unsupported architectures raise ModelError."""
        names = list(cfg.get("architectures") or []) + [cfg.get("model_type", "")]
        arch = next((ARCHITECTURES[n] for n in names if n in ARCHITECTURES), None)
        if arch is None:
            raise ModelError(f"{source}: unsupported architecture {names[0] if names else None!r} "
                             f"(supported: {sorted(set(ARCHITECTURES))})")
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}  # transformers 4 / 5 spelling
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
            raise ModelError(f"{source}: unsupported RoPE scaling {rope!r} (only the default RoPE)")
        if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
            raise ModelError(f"{source}: unsupported hidden_act {cfg['hidden_act']!r} (SwiGLU needs silu)")
        if cfg.get("use_sliding_window"):
            raise ModelError(f"{source}: sliding-window attention is not supported")
        heads = cfg["num_attention_heads"]
        return cls(
            arch=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rope_theta=float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 1e4)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        )
