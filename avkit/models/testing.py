"""Tiny random-init models for tests: a HF directory written by transformers (config, safetensors, tokenizer).
Same ``vocab`` -> the same deterministic byte-level BPE; seeds pick the weights (a draft/target pair for engine
tests is two seeds of the same vocab).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from avkit.errors import ConfigError
from avkit.models.tokenizer import byte_level

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "Speculative decoding drafts tokens with a small model and verifies them with a large one.",
    "if x is None or len(x) == 0:\n        raise ValueError('empty input')\n",
    "Hello, world! How are you today? I'm fine, thanks.",
]


def train_tokenizer(vocab: int):
    """A deterministic byte-level BPE with the Qwen2 split regex and ChatML special tokens."""
    tok = byte_level(Tokenizer(models.BPE()), "qwen2")
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=1)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tok


def write_tiny_model(directory, arch: str = "qwen2", vocab: int = 512, seed: int = 0, *, hidden: int = 64,
                     layers: int = 2, heads: int = 4, kv_heads: int = 2, intermediate: int = 128,
                     tie_word_embeddings: bool = False, init_std: float = 0.02,
                     rope_theta: float = 10000.0) -> Path:
    """Write a tiny random-init HF model directory and return its path.

    >>> path = write_tiny_model(tmp_path / "tiny", arch="qwen2", vocab=512, seed=0)  # doctest: +SKIP
    >>> avkit.models.load(path).model.config.vocab_size  # doctest: +SKIP
    512
    """
    import transformers  # lazy: transformers (tests only)

    if arch not in ("qwen2", "llama"):
        raise ConfigError(f"arch must be 'qwen2' or 'llama', got {arch!r}")
    if vocab < 260:
        raise ConfigError(f"vocab must be >= 260 (256 bytes + special tokens), got {vocab}")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(vocab)
    common = {
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": intermediate,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": rope_theta,
        "tie_word_embeddings": tie_word_embeddings, "initializer_range": init_std,
        "eos_token_id": tok.token_to_id("<|im_end|>"), "bos_token_id": tok.token_to_id("<|endoftext|>"),
    }
    config, cls = {"qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                   "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}[arch]
    torch.manual_seed(seed)
    model = cls(config(**common)).eval()  # Llama: no attention or MLP biases (its config's defaults)
    if arch == "qwen2":  # HF zero-initialises biases; random ones make the bias path testable
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, init_std)
    model.save_pretrained(path, safe_serialization=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>", "bos_token": None,
        "pad_token": "<|endoftext|>", "model_max_length": 4096,
    }, indent=1))
    return path

