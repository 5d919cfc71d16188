"""The GGUF reader and chunked dequantization against gguf-py (the oracle), on synthetic data."""

import gguf
import numpy as np
import pytest
import torch

from avkit.errors import ModelError
from avkit.models import gguf_file as dequant
from avkit.models.gguf_file import GGUFFile

Q = gguf.GGMLQuantizationType


def random_blocks(qtype, n_blocks: int, seed: int) -> np.ndarray:
    """Random codes with finite float16 scales at the offsets ggml keeps them."""
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    scale_at = {Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q2_K: [size - 4, size - 2], Q.Q6_K: [size - 2],
                Q.Q3_K: [size - 2]}.get(qtype, [0])
    for off in scale_at:
        raw[:, off:off + 2] = rng.uniform(-0.1, 0.1, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(-1)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.Q4_K, Q.Q6_K, Q.Q5_K, Q.Q2_K, Q.Q3_K])
def test_chunked_dequant_equals_gguf(qtype, monkeypatch):
    monkeypatch.setattr(dequant, "_CHUNK_BLOCKS", 3)  # several chunks, the last one partial
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    raw = random_blocks(qtype, 10, seed=int(qtype))
    shape = (5, 2 * block)
    got = dequant.dequantize(raw, int(qtype), shape)
    want = gguf.quants.dequantize(raw, qtype).reshape(shape)
    assert got.dtype == torch.float32 and tuple(got.shape) == shape
    assert np.array_equal(got.numpy(), want)


def test_float_types():
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for qtype, raw in ((Q.F32, x.view(np.uint8).reshape(-1)), (Q.F16, x.astype(np.float16).view(np.uint8).reshape(-1))):
        got = dequant.dequantize(raw, int(qtype), (3, 4))
        assert np.allclose(got.numpy(), x, atol=1e-3)
        assert got.numpy().flags.writeable  # owns its memory, not a view of the read-only map


@pytest.fixture()
def small_gguf(tmp_path):
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(2)
    w.add_rope_freq_base(1e6)
    w.add_token_list(["a", "b", "c d"])
    w.add_token_types([1, 1, 3])
    w.add_array("custom.ints", [1, 2, 3])
    w.add_tensor("x.weight", np.arange(24, dtype=np.float32).reshape(4, 6))
    w.add_tensor("y.weight", np.ones(7, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_reader_matches_gguf_reader(small_gguf):
    ours, ref = GGUFFile(small_gguf), gguf.GGUFReader(str(small_gguf))
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        want = field.contents()
        got = ours.metadata[key]
        assert got == pytest.approx(want) if isinstance(want, float) else got == want, key
    for t in ref.tensors:
        ours_t = ours.tensors[t.name]
        assert ours_t.shape == tuple(int(d) for d in reversed(t.shape))
        got = dequant.dequantize(ours.raw(ours_t), ours_t.ggml_type, ours_t.shape)
        assert np.array_equal(got.numpy().reshape(-1), np.asarray(t.data).reshape(-1))


def test_truncated_gguf_is_model_error(small_gguf, tmp_path):
    data = small_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-40])
    with pytest.raises(ModelError, match="past the end"):
        GGUFFile(cut)
    cut.write_bytes(data[:60])
    with pytest.raises(ModelError, match="truncated or corrupt"):
        GGUFFile(cut)
