"""avkit's forward vs HF transformers (the oracle) on tiny random-init Llama and Qwen2 models, fp32.

Every comparison runs HF on each sequence alone (no padding, no cache), so the oracle shares nothing
with avkit's batching, masking or KV-cache code.
"""

import pytest
import torch

import avkit.models
from avkit.errors import ConfigError
from avkit.models.testing import write_tiny_model

ATOL = 1e-4
VOCAB = 300


@pytest.fixture(scope="module", params=[("qwen2", False), ("llama", True)], ids=["qwen2", "llama-tied"])
def pair(request, tmp_path_factory):
    import transformers

    arch, tied = request.param
    path = write_tiny_model(tmp_path_factory.mktemp(arch), arch=arch, vocab=VOCAB, seed=1,
                            tie_word_embeddings=tied, init_std=0.1, rope_theta=500.0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    loaded = avkit.models.load(path)
    assert loaded.model.config.rope_theta == 500.0  # read from config.json, not a default
    return loaded, hf


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()  # [S, V]


def pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    S = max(map(len, rows))
    tokens = torch.tensor([r + [0] * (S - len(r)) for r in rows])  # [B, S], pad id 0 on purpose
    return tokens, torch.tensor([len(r) for r in rows])


def random_rows(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def test_prefill_batch_with_different_lengths(pair):
    loaded, hf = pair
    rows = random_rows([7, 3, 11, 1], seed=0)
    tokens, q_lens = pad(rows)
    cache = loaded.model.new_cache(4, 32)
    out = loaded.model.forward(tokens, q_lens, torch.arange(4), cache)  # [B, S, V]
    for b, r in enumerate(rows):
        torch.testing.assert_close(out[b, : len(r)], hf_logits(hf, r), atol=ATOL, rtol=0)
    assert cache.lengths[:4].tolist() == [7, 3, 11, 1]


def test_decode_steps_variable_tokens_and_rollback(pair):
    """Prefill, then steps feeding 1 or 3 tokens per row, a rollback, then more steps (slots not 0..B-1)."""
    loaded, hf = pair
    model, slots = loaded.model, torch.tensor([5, 2])
    seqs = random_rows([6, 9], seed=1)
    cache = model.new_cache(6, 64)
    tokens, q_lens = pad(seqs)
    model.forward(tokens, q_lens, slots, cache, logits="last")
    steps = [[1, 3], [3, 1], [1, 1], [2, 3]]
    for i, feed in enumerate(steps):
        new = random_rows(feed, seed=10 + i)
        tokens, q_lens = pad(new)
        out = model.forward(tokens, q_lens, slots, cache)  # [2, S, V]
        for b in range(2):
            seqs[b] = seqs[b] + new[b]
            want = hf_logits(hf, seqs[b])[-feed[b]:]
            torch.testing.assert_close(out[b, : feed[b]], want, atol=ATOL, rtol=0)
        if i == 1:  # reject the last 2 tokens of row 0 and the last one of row 1
            seqs = [seqs[0][:-2], seqs[1][:-1]]
            cache.truncate(slots, torch.tensor([len(s) for s in seqs]))
    assert cache.lengths[slots].tolist() == [len(s) for s in seqs]


def test_last_and_index_logits_match_all(pair):
    loaded, _ = pair
    tokens, q_lens = pad(random_rows([5, 2, 4], seed=2))
    outs = {}
    for mode in ("all", "last", torch.tensor([[0, 4], [1, 0], [3, 2]])):
        cache = loaded.model.new_cache(3, 16)
        outs[mode if isinstance(mode, str) else "index"] = loaded.model.forward(
            tokens, q_lens, torch.arange(3), cache, logits=mode)
    last = outs["all"][torch.arange(3), q_lens - 1]  # [B, V]
    torch.testing.assert_close(outs["last"], last, atol=1e-5, rtol=0)
    torch.testing.assert_close(outs["index"][0, 1], outs["all"][0, 4], atol=1e-5, rtol=0)
    torch.testing.assert_close(outs["index"][2, 0], outs["all"][2, 3], atol=1e-5, rtol=0)
    assert outs["last"].dtype == torch.float32


def test_free_slot_restarts_sequence(pair):
    loaded, hf = pair
    cache = loaded.model.new_cache(2, 16)
    a, b = random_rows([4, 3], seed=3)
    loaded.model.forward(torch.tensor([a]), torch.tensor([4]), torch.tensor([1]), cache)
    cache.free(1)
    out = loaded.model.forward(torch.tensor([b]), torch.tensor([3]), torch.tensor([1]), cache)
    torch.testing.assert_close(out[0], hf_logits(hf, b), atol=ATOL, rtol=0)


def test_pad_ids_are_ignored(pair):
    model = pair[0].model
    a = model.forward(torch.tensor([[5, 6], [7, 0]]), torch.tensor([2, 1]), torch.tensor([0, 1]), model.new_cache(2, 4))
    b = model.forward(torch.tensor([[5, 6], [7, -1]]), torch.tensor([2, 1]), torch.tensor([0, 1]), model.new_cache(2, 4))
    torch.testing.assert_close(a[1, 0], b[1, 0], atol=0, rtol=0)


def test_truncate_never_grows(pair):
    cache = pair[0].model.new_cache(2, 8)
    cache.lengths[:] = torch.tensor([3, 5])
    cache.truncate(torch.tensor([1, 0]), torch.tensor([2, 4]))  # slot 1 rolls back to 2; slot 0 keeps 3
    assert cache.lengths.tolist() == [3, 2]


@pytest.mark.parametrize("bad", ["q_len_zero", "dup_slots", "overflow", "token_id"])
def test_bad_forward_inputs(pair, bad):
    model = pair[0].model
    cache = model.new_cache(2, 4)
    tokens, q_lens, slots = torch.tensor([[1, 2], [3, 4]]), torch.tensor([2, 2]), torch.tensor([0, 1])
    with pytest.raises(ConfigError):
        if bad == "q_len_zero":
            model.forward(tokens, torch.tensor([0, 2]), slots, cache)
        elif bad == "dup_slots":
            model.forward(tokens, q_lens, torch.tensor([1, 1]), cache)
        elif bad == "overflow":
            for _ in range(3):
                model.forward(tokens, q_lens, slots, cache)
        else:
            model.forward(torch.tensor([[1, VOCAB]]), torch.tensor([2]), torch.tensor([0]), cache)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_forward_matches_cpu(tmp_path):
    path = write_tiny_model(tmp_path / "gpu", arch="qwen2", vocab=VOCAB, seed=2, init_std=0.1)
    cpu, gpu = avkit.models.load(path), avkit.models.load(path, device="cuda")
    tokens, q_lens = pad(random_rows([5, 2], seed=4))
    slots = torch.tensor([1, 0])
    want = cpu.model.forward(tokens, q_lens, slots, cpu.model.new_cache(2, 8))
    got = gpu.model.forward(tokens.cuda(), q_lens.cuda(), slots.cuda(), gpu.model.new_cache(2, 8))
    torch.testing.assert_close(got.cpu(), want, atol=1e-3, rtol=1e-3)  # TF32 / kernel differences


class _NoHostReads:
    """Within the block, reading a tensor back to the host (tolist / item / bool / int) raises."""

    NAMES = ("tolist", "item", "__bool__", "__int__", "__index__")

    def __enter__(self):
        self.saved = {n: getattr(torch.Tensor, n) for n in self.NAMES}

        def refuse(*_a, **_k):
            raise AssertionError("host read inside forward(host=...)")

        for n in self.NAMES:
            setattr(torch.Tensor, n, refuse)

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            setattr(torch.Tensor, n, f)


def test_host_lengths_same_logits_no_host_reads(pair):
    """forward(host=HostLengths(...)) computes what the plain call computes, bit for bit, reading nothing back.

    Rows of different lengths and widths (padding), non-consecutive slots, a row ending at max_len, then a
    one-token decode step."""
    model = pair[0].model
    from avkit.models.transformer import HostLengths

    rows = random_rows([3, 6, 1], seed=5)
    slots = torch.tensor([4, 1, 2])
    plain, fast = model.new_cache(5, 12), model.new_cache(5, 12)
    cached = [0, 0, 0]
    for feed in (rows, random_rows([8, 2, 4], seed=6), random_rows([1, 1, 1], seed=7)):
        tokens, q_lens = pad(feed)
        want = model.forward(tokens, q_lens, slots, plain)
        host = HostLengths(tuple(slots.tolist()), tuple(cached), tuple(map(len, feed)))
        with _NoHostReads():
            got = model.forward(tokens, q_lens, slots, fast, host=host)
        for b, r in enumerate(feed):
            torch.testing.assert_close(got[b, : len(r)], want[b, : len(r)], atol=0, rtol=0)
        cached = [c + len(r) for c, r in zip(cached, feed)]
        assert fast.lengths.tolist() == plain.lengths.tolist()
        for s, n in zip(slots.tolist(), cached):
            torch.testing.assert_close(fast.k[:, s, :, :n], plain.k[:, s, :, :n], atol=0, rtol=0)
            torch.testing.assert_close(fast.v[:, s, :, :n], plain.v[:, s, :, :n], atol=0, rtol=0)
    assert max(cached) == 12  # row 0 reached max_len


def test_host_lengths_must_describe_every_row(pair):
    from avkit.models.transformer import HostLengths

    with pytest.raises(ConfigError, match="one entry per row"):
        HostLengths((0, 1), (3,), (1, 1))
    with pytest.raises(ConfigError, match="2 distinct values"):
        pair[0].model.forward(torch.tensor([[1], [2]]), torch.tensor([1, 1]), torch.tensor([0, 1]),
                              pair[0].model.new_cache(2, 4), host=HostLengths((0,), (0,), (1,)))
