"""Batch invariance of the CPU backend's bf16 forward (issue 17): a token's logits are bit-identical whether it is
decoded alone, verified inside a (1 + k)-token forward, or batched beside other requests of other lengths; so
greedy speculative output equals greedy target-only output token for token in bf16.

Oracle for the logits: the same model's own one-token decode (bitwise, `torch.equal`); for the attention
kernel's values: float64 attention (within bf16 rounding). Skipped where the CPU kernels cannot build.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import avkit.models
from avkit.config import EngineConfig
from avkit.drafters.base import DraftInput, DraftProposal
from avkit.models import cpu_linear, native
from avkit.models.testing import write_tiny_model
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.config import SamplingConfig

pytestmark = pytest.mark.skipif(not native.runs_here("avx2"), reason="CPU bf16 kernels unavailable here")

@pytest.fixture(autouse=True, scope="module")
def _built():
    """Built here, at test time (once per machine and kernel version), not while the suite is collected."""
    if not (cpu_linear.available() and native.load("attention") is not None):
        pytest.skip("the CPU bf16 kernels did not build here (no compiler or ninja)")

VOCAB = 300


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A bf16 Qwen2-shaped target (GQA 4 heads over 2, head_dim 32, biases) and a noisy bf16 copy as its draft."""
    root = tmp_path_factory.mktemp("binv_models")
    path = write_tiny_model(root / "t", vocab=VOCAB, seed=0, hidden=128, heads=4, kv_heads=2, intermediate=256,
                            init_std=0.3)
    target = avkit.models.load(path, dtype=torch.bfloat16)
    noisy = avkit.models.load(path, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in noisy.model.parameters():
            p.add_((torch.randn(p.shape, generator=g) * 0.3 * p.float().std()).bfloat16())
        for name, b in noisy.model.named_buffers():  # the packed panels (pack_for_cpu)
            if name.endswith("packed"):
                b.add_((torch.randn(b.shape, generator=g) * 0.3 * b.float().std()).bfloat16())
        for m in noisy.model.modules():  # the prefill path's oneDNN copies follow the noisy panels
            if isinstance(m, cpu_linear.PackedLinear) and m.bulk_weight is not None:
                m.bulk_weight = cpu_linear.bulk_pack(m.unpacked())
    assert target.model.dtype == torch.bfloat16
    return {"target": target, "noisy": noisy}


@pytest.mark.parametrize(("heads", "kv_heads", "d"), [(4, 2, 32), (12, 2, 128), (3, 3, 16)])
def test_attention_kernel_matches_float64_like_sdpa(heads, kv_heads, d):
    """Oracle: float64 softmax(q k^T / sqrt(D)) v over each query's own span, rounded once to bf16. The kernel
    (fp32 sums) may differ by a bf16 step plus fp32 error; torch's bf16 SDPA, masked, meets the same bound."""
    g = torch.Generator().manual_seed(heads * 100 + d)
    B, S, T = 3, 5, 40
    q = torch.randn(B, S, heads, d, generator=g).bfloat16()
    k = (torch.randn(4, kv_heads, T, d, generator=g) * 2).bfloat16()  # a 4-slot cache layer
    v = torch.randn(4, kv_heads, T, d, generator=g).bfloat16()
    slots = torch.tensor([3, 0, 2])
    ends = torch.tensor([[1, 2, 3, 4, 5], [20, 21, 22, 0, 0], [36, 37, 38, 39, 40]])  # row 1: 2 pads
    out = native.attention(q, k, v, slots, ends, d ** -0.5)  # [B, S, H, D]
    grp = heads // kv_heads
    kk = k[slots].repeat_interleave(grp, dim=1).double()  # [B, H, T, D]
    vv = v[slots].repeat_interleave(grp, dim=1).double()
    scores = torch.einsum("bshd,bhtd->bhst", q.double(), kk) * d ** -0.5  # [B, H, S, T]
    visible = torch.arange(T)[None, None, :] < ends[:, :, None]  # [B, S, T]
    ref = torch.einsum("bhst,bhtd->bshd", scores.masked_fill(~visible[:, None], -torch.inf).softmax(-1).nan_to_num(),
                       vv)  # [B, S, H, D]
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k[slots].repeat_interleave(grp, dim=1), v[slots].repeat_interleave(grp, dim=1),
        attn_mask=visible[:, None] | ~visible.any(-1)[:, None, :, None]).transpose(1, 2)
    real = ends > 0  # [B, S]
    bound = ref.abs() * 2.0 ** -8 + 1e-3 * vv.abs().amax()
    assert bool(((out.double() - ref).abs() <= bound)[real].all())
    assert bool(((sdpa.double() - ref).abs() <= bound)[real].all())
    assert bool((out[~real] == 0).all())


def test_attention_rows_do_not_depend_on_the_call():
    """Each query row alone (its own call) equals the same row inside a call of many rows and slots."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 4, 32, generator=g).bfloat16()
    k, v = torch.randn(2, 3, 2, 300, 32, generator=g).bfloat16()
    slots, ends = torch.tensor([2, 0]), torch.tensor([[295, 296, 297, 298, 299, 300], [7, 8, 9, 0, 0, 0]])
    full = native.attention(q, k, v, slots, ends, 32 ** -0.5)
    for b, s in [(0, 0), (0, 5), (1, 2)]:
        one = native.attention(q[b:b + 1, s:s + 1], k, v, slots[b:b + 1], ends[b:b + 1, s:s + 1], 32 ** -0.5)
        assert torch.equal(one[0, 0], full[b, s])


def test_silu_is_the_same_on_torchs_vector_and_scalar_paths():
    """Every bf16 input: F.silu in a long tensor (torch's vectorised loop) equals F.silu in tensors shorter than
    one vector (its scalar tail loop), so where a thread's range splits a row cannot change a value."""
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)  # [65536]
    every = every[~every.isnan()]  # NaN payloads may differ; a NaN is a NaN on both paths
    vector = torch.nn.functional.silu(every)
    scalar = torch.cat([torch.nn.functional.silu(c) for c in every.split(7)])
    both_nan = vector.isnan() & scalar.isnan()  # silu(-inf) = -inf * 0 = NaN, whose payload bits differ by path
    assert int(both_nan.sum()) <= 1  # that one input, at most
    assert torch.equal(vector[~both_nan].view(torch.int16), scalar[~both_nan].view(torch.int16))  # bitwise


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(5, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _forward(model, cache, rows: list[tuple[int, list[int]]], logits="all") -> torch.Tensor:
    """One forward appending ``tokens`` to ``slot`` for each (slot, tokens) row, right-padded with -1."""
    S = max(len(t) for _, t in rows)
    tokens = torch.tensor([t + [-1] * (S - len(t)) for _, t in rows])  # [B, S]
    q_lens = torch.tensor([len(t) for _, t in rows])
    slots = torch.tensor([s for s, _ in rows])
    cached = tuple(int(cache.lengths[s]) for s, _ in rows)
    host = avkit.models.HostLengths(tuple(s for s, _ in rows), cached, tuple(q_lens.tolist()))
    return model.forward(tokens, q_lens, slots, cache, logits, host=host)


@pytest.mark.parametrize("prompt_len", [1, 37, 300])
def test_a_tokens_logits_do_not_depend_on_the_forward_it_is_in(models, prompt_len):
    """(a) one-token decode steps, (b) one (1 + k)-token verify forward, (c) the same verify batched with other
    requests of other cached lengths and query counts (its row third, slots not consecutive), (d) its prompt
    prefilled in 2 chunks beside another prompt of the same length: the logits are bit-identical."""
    model = models["target"].model
    prompt, cont = _tokens(prompt_len, prompt_len), _tokens(8, 1000 + prompt_len)

    cache = model.new_cache(4, 512)
    _forward(model, cache, [(0, prompt)], torch.zeros(1, 0, dtype=torch.int64))
    decode = torch.stack([_forward(model, cache, [(0, [t])])[0, 0] for t in cont])  # [8, V]

    cache = model.new_cache(4, 512)
    _forward(model, cache, [(0, prompt)], torch.zeros(1, 0, dtype=torch.int64))
    verify = _forward(model, cache, [(0, cont)])[0]  # [8, V]
    assert torch.equal(verify, decode)

    cache = model.new_cache(6, 512)
    others = {1: _tokens(5, 1), 4: _tokens(200, 2), 5: _tokens(prompt_len, 3)}
    half = max(1, prompt_len // 2)
    none = torch.zeros(2, 0, dtype=torch.int64)
    _forward(model, cache, [(2, prompt[:half]), (5, others[5][:half])], none)  # batched, chunked prefill
    if half < prompt_len:
        _forward(model, cache, [(2, prompt[half:]), (5, others[5][half:])], none)
    for slot in (1, 4):
        _forward(model, cache, [(slot, others[slot])], torch.zeros(1, 0, dtype=torch.int64))
    batched = _forward(model, cache, [(1, _tokens(3, 4)), (4, _tokens(1, 5)), (2, cont), (5, _tokens(8, 6))])
    assert torch.equal(batched[2], decode)
    last = _forward(model, cache, [(4, _tokens(2, 7)), (2, _tokens(1, 8))], "last")  # "last" = the decode row
    cache2 = model.new_cache(4, 512)
    _forward(model, cache2, [(0, prompt + cont)], torch.zeros(1, 0, dtype=torch.int64))
    alone = _forward(model, cache2, [(0, _tokens(1, 8))])[0, 0]
    assert torch.equal(last[1], alone)


def test_an_uneven_verify_forward_computes_real_tokens_only(models):
    """One row verifying 7 drafts beside three verifying none: the linears and the LM head see the 1 + 8 + 1 + 1
    real tokens, not 4 x 8 padded ones (the ragged path), pad logits are zero, and each row's logits equal the
    row forwarded alone, bitwise; equal drafts everywhere keep the padded [B, S] path (nothing to skip)."""
    model = models["target"].model
    seen: dict[str, list[int]] = {"qkv": [], "head": []}
    spies = {"qkv": model.layers[0].attn.qkv, "head": model.lm_head}
    for name, layer in spies.items():  # each spy counts the rows its layer sees, then runs the layer
        layer.forward = lambda x, bulk=False, plain=layer.forward, name=name: (
            seen[name].append(x.reshape(-1, x.shape[-1]).shape[0]), plain(x))[1]
    try:
        rows = [(0, _tokens(1, 11)), (1, _tokens(8, 12)), (2, _tokens(1, 13)), (3, _tokens(1, 14))]
        prompts = [_tokens(5 + 40 * s, 20 + s) for s in range(4)]
        cache = model.new_cache(4, 256)
        for s, prompt in enumerate(prompts):
            _forward(model, cache, [(s, prompt)], torch.zeros(1, 0, dtype=torch.int64))
        for calls in seen.values():
            calls.clear()
        together = _forward(model, cache, rows)  # [4, 8, V]
        assert seen == {"qkv": [11], "head": [11]}
        assert bool((together[0, 1:] == 0).all()) and bool((together[2:, 1:] == 0).all())
        for s, toks in rows:
            alone_cache = model.new_cache(4, 256)
            _forward(model, alone_cache, [(s, prompts[s])], torch.zeros(1, 0, dtype=torch.int64))
            alone = _forward(model, alone_cache, [(s, toks)])[0]  # [q, V]
            assert torch.equal(together[s, :len(toks)], alone)
        for calls in seen.values():
            calls.clear()
        _forward(model, cache, [(s, _tokens(3, 30 + s)) for s in range(4)])
        assert seen == {"qkv": [12], "head": [12]}
    finally:
        for layer in spies.values():
            del layer.forward


class RandomDrafter:
    """Drafts uniformly random tokens (one-hot q): almost every draft is rejected, so verify forwards of
    1 + k tokens are followed by rollbacks, the pattern most unlike target-only decoding."""

    kind = "random"
    forward_s = 0.0
    plans = False
    passes = 0  # no draft forwards: the cost model sees no draft pass
    lookups = 0  # no cache lookups either

    def __init__(self, vocab: int, seed: int):
        self.vocab, self.g = vocab, torch.Generator().manual_seed(seed)

    def propose(self, inp: DraftInput) -> DraftProposal:
        B, K = len(inp.sequences), inp.k
        tokens = torch.randint(0, self.vocab, (B, K), generator=self.g)  # [B, K]
        probs = torch.nn.functional.one_hot(tokens, self.vocab).float()  # [B, K, V]
        return DraftProposal(tokens, probs, torch.ones(B, K), {}, inp.num_draft.clone(), [self.kind] * B)

    def lag(self, slot, length) -> int:
        return 0  # no cache of its own: never behind

    def commit(self, slots, num_valid, host=None) -> None:
        pass

    def observe_final(self, slot, sequence) -> None:
        pass

    def release(self, slot) -> None:
        pass


def _requests(n: int) -> list[Request]:
    return [Request(f"r{i}", _tokens(3 + 29 * i, 50 + i), SamplingConfig(temperature=0.0, max_new_tokens=40))
            for i in range(n)]


def _no_eos(m):  # random models emit EOS at random; full-length outputs compare more tokens
    return dataclasses.replace(m, tokenizer=type("T", (), {"eos_token_ids": set()})())


@pytest.mark.parametrize("c", [1, 4])
@pytest.mark.parametrize("drafter", ["model", "random"])
def test_greedy_speculative_equals_target_only_in_bf16(models, c, drafter):
    """K = 1..7 at c = 1 and c = 4 (6 requests through 4 slots at c = 4: continuous batching)."""
    target = _no_eos(models["target"])
    reqs = _requests(6 if c == 4 else 2)
    ref = Engine(target, None, EngineConfig(k=0, concurrency=c, max_len=256)).generate(reqs)
    for k in range(1, 8):
        if drafter == "model":
            eng = Engine(target, models["noisy"], EngineConfig(k=k, concurrency=c, max_len=256))
        else:
            eng = Engine(target, None, EngineConfig(k=k, concurrency=c, max_len=256), drafter=RandomDrafter(VOCAB, k))
        spec = eng.generate(reqs)
        for a, b in zip(ref, spec):
            assert b.output_ids == a.output_ids, (k, a.request_id)
