"""GGUF round trip: a tiny HF model converted to F32 GGUF (llama.cpp names, llama q/k permutation)
loads to the same logits and the same tokenizer as the HF directory it came from."""

from dataclasses import replace

import pytest
import torch

import avkit.models
from avkit.models.testing import write_tiny_gguf, write_tiny_model
from avkit.models.weights import permute_qk, unpermute_qk


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

    from avkit.hvd.token_classes import class_table, load_vocab

    hf_dir = write_tiny_model(tmp_path / "hf", vocab=300)
    gguf_path = write_tiny_gguf(hf_dir, tmp_path / "tiny.gguf")
    vocab = load_vocab(gguf_path)
    assert vocab == list(gguf.GGUFReader(str(gguf_path)).fields["tokenizer.ggml.tokens"].contents())
    assert (class_table(vocab) == class_table(load_vocab(hf_dir))).all()
