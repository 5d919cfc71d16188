"""GGUF round trip: a tiny HF model converted to F32 GGUF (llama.cpp names, llama q/k permutation)
loads to the same logits and the same tokenizer as the HF directory it came from."""

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import avkit.models
from avkit.models.testing import write_tiny_model
from avkit.models.loader import TENSORS
from avkit.models.gguf_file import unpermute_qk

_HF_TO_GGUF = {hf: g for parts in TENSORS.values() for hf, g in parts}
_LAYER = re.compile(r"\.(\d+)\.")


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for arch llama: per head, rows (0, D/2, 1, D/2+1, ...)."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(hf_dir, out_path) -> Path:
    """Convert a tiny HF directory (from :func:`write_tiny_model`) to an F32 GGUF as llama.cpp would.

    Tensor names are llama.cpp's; for arch ``llama`` the q/k rows are permuted like llama.cpp's converter;
    a tied model gets no ``output.weight``. Used by the GGUF round-trip test.
    """
    import gguf
    from safetensors.numpy import load_file

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
        g = _HF_TO_GGUF.get(_LAYER.sub(".{i}.", name, count=1))
        g = g and g.format(i=next(iter(_LAYER.findall(name)), ""))
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


@pytest.mark.parametrize("arch,tied", [("qwen2", False), ("llama", True)])
def test_gguf_round_trip_logits_and_tokenizer(tmp_path, arch, tied):
    hf_dir = write_tiny_model(tmp_path / "hf", arch=arch, vocab=300, seed=3, tie_word_embeddings=tied,
                              init_std=0.1)
    gguf_path = write_tiny_gguf(hf_dir, tmp_path / "tiny.gguf")
    a, b = avkit.models.load(hf_dir), avkit.models.load(gguf_path)
    ca, cb = a.model.config, b.model.config
    assert cb.rms_norm_eps == pytest.approx(ca.rms_norm_eps, rel=1e-6)  # GGUF stores float32
    assert replace(cb, rms_norm_eps=ca.rms_norm_eps) == ca
    tokens = torch.randint(0, 300, (2, 6), generator=torch.Generator().manual_seed(0))
    q_lens, slots = torch.tensor([6, 4]), torch.tensor([0, 1])
    la = a.model.forward(tokens, q_lens, slots, a.model.new_cache(2, 8))
    lb = b.model.forward(tokens, q_lens, slots, b.model.new_cache(2, 8))
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=0)
    text = "def f(x):\n    return x ** 2  # ünïcode 42\n"
    assert a.tokenizer.encode(text) == b.tokenizer.encode(text)
    msgs = [{"role": "user", "content": "hi"}]
    assert a.tokenizer.apply_chat_template(msgs) == b.tokenizer.apply_chat_template(msgs)
    assert a.tokenizer.eos_token_ids & b.tokenizer.eos_token_ids
    assert b.sha256 != a.sha256 and len(b.sha256) == 64


def test_unpermute_inverts_llama_cpp_permutation():
    w = torch.randn(4 * 8, 5).numpy()  # 4 heads of dim 8
    p = permute_qk(w, 4)
    assert not (p == w).all()
    assert (unpermute_qk(p, 4) == w).all()


def test_hvd_vocabulary_from_gguf_equals_gguf_py_and_hf(tmp_path):
    """The HVD token classes read a GGUF vocabulary with avkit's header parser: gguf-py's reader (the oracle)
    and the HF directory it came from give the same entries and the same class table."""
    import gguf

    from avkit.hvd.features import class_table, load_vocab

    hf_dir = write_tiny_model(tmp_path / "hf", vocab=300)
    gguf_path = write_tiny_gguf(hf_dir, tmp_path / "tiny.gguf")
    vocab = load_vocab(gguf_path)
    assert vocab == list(gguf.GGUFReader(str(gguf_path)).fields["tokenizer.ggml.tokens"].contents())
    assert (class_table(vocab) == class_table(load_vocab(hf_dir))).all()
