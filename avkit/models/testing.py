"""Tiny random-init models for tests: a HF directory written by transformers (config, safetensors, tokenizer).

``write_tiny_model(dir, arch="qwen2")`` trains a small byte-level BPE (deterministic) on a fixed corpus,
builds a ``Qwen2ForCausalLM`` / ``LlamaForCausalLM`` with ``torch.manual_seed(seed)`` and saves both.
Same ``vocab`` and ``seed`` -> the same tokenizer; different seeds -> different weights (a draft/target
pair for engine tests is two seeds of the same vocab).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from avkit.errors import ConfigError
from avkit.models.tokenizer import byte_level
from avkit.models.weights import hf_name_to_gguf, permute_qk

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
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # lazy: tokenizers

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
    if arch == "qwen2":
        config = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    else:
        config = transformers.LlamaConfig(**common, attention_bias=False, mlp_bias=False)
        cls = transformers.LlamaForCausalLM
    torch.manual_seed(seed)
    model = cls(config).eval()
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


def write_tiny_pair(root, noise: float = 0.05) -> tuple[Path, Path]:
    """A tiny Qwen2 target with peaked logits and a draft = target + `noise` x std Gaussian noise on every
    matrix (seeded), under `root`/target and `root`/draft: some drafts are accepted, some rejected."""
    from safetensors.torch import load_file, save_file  # lazy: safetensors

    root = Path(root)
    target = write_tiny_model(root / "target", vocab=512, seed=0, hidden=128, heads=2, kv_heads=1,
                              intermediate=256, init_std=0.5)
    draft = root / "draft"
    shutil.copytree(target, draft, dirs_exist_ok=True)
    g = torch.Generator().manual_seed(1)
    sd = load_file(str(target / "model.safetensors"))
    sd = {k: (v + noise * v.std() * torch.randn(v.shape, generator=g)).contiguous() if v.dim() > 1 else v
          for k, v in sd.items()}
    save_file(sd, str(draft / "model.safetensors"), metadata={"format": "pt"})
    return target, draft


def write_tiny_gguf(hf_dir, out_path) -> Path:
    """Convert a tiny HF directory (from :func:`write_tiny_model`) to an F32 GGUF as llama.cpp would.

    Tensor names are llama.cpp's; for arch ``llama`` the q/k rows are permuted like llama.cpp's converter;
    a tied model gets no ``output.weight``. Used by the GGUF round-trip test.
    """
    import gguf  # lazy: gguf
    from safetensors.numpy import load_file  # lazy: safetensors

    hf_dir, out_path = Path(hf_dir), Path(out_path)
    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = cfg["model_type"]
    w = gguf.GGUFWriter(str(out_path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"] if "rope_theta" in cfg else cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    _add_gguf_tokenizer(w, hf_dir)
    for name, t in sorted(load_file(str(hf_dir / "model.safetensors")).items()):
        g = hf_name_to_gguf(name)
        if g is None or (g == "output.weight" and cfg.get("tie_word_embeddings")):
            continue
        if arch == "llama" and g.endswith("attn_q.weight"):
            t = permute_qk(t, cfg["num_attention_heads"])
        elif arch == "llama" and g.endswith("attn_k.weight"):
            t = permute_qk(t, cfg["num_key_value_heads"])
        w.add_tensor(g, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path


def _add_gguf_tokenizer(w, hf_dir: Path) -> None:
    tj = json.loads((hf_dir / "tokenizer.json").read_text())
    conf = json.loads((hf_dir / "tokenizer_config.json").read_text())
    vocab = dict(tj["model"]["vocab"])
    special = {a["content"]: a["id"] for a in tj["added_tokens"]}
    vocab.update(special)
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_eos_token_id(special[conf["eos_token"]])
    w.add_chat_template(conf["chat_template"])
