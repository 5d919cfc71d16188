"""The CPU backend's prefill path (avkit/models/cpu_linear.py bulk_linear): oneDNN's bf16 matmul in fixed BULK_ROWS-row calls.

Oracles: the exact product in float64 (within one bf16 rounding plus fp32 summation error, the bound
torch's own bf16 F.linear meets too), and the path itself at other row counts and companions (bitwise:
a prefill token's value must not depend on the other tokens of its forward). Skipped on CPUs where
oneDNN has no bf16 fast path (no AMX / AVX512-BF16), where the engine never takes this path.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import avkit.models
from avkit.models import cpu_linear, native
from avkit.models.testing import write_tiny_model

pytestmark = pytest.mark.skipif(not (cpu_linear.bulk_available() and native.runs_here("avx2")),
                                reason="oneDNN bf16 fast path (AMX / AVX512-BF16) or the CPU kernel unavailable here")

@pytest.fixture(autouse=True, scope="module")
def _built():
    """Built here, at test time (once per machine and kernel version), not while the suite is collected."""
    if not (cpu_linear.available()):
        pytest.skip("the CPU bf16 kernel did not build here (no compiler or ninja)")



def _bound(ref64: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per output: one bf16 rounding step of the result + fp32 summation error of K products."""
    return ref64.abs() * 2.0 ** -8 + (x.double().abs() @ w.double().abs().T) * x.shape[-1] * 2.0 ** -23 + 1e-30


@pytest.mark.parametrize("m", [1, 5, 63, 64, 65, 130])
@pytest.mark.parametrize(("n", "k", "bias"), [(37, 100, True), (130, 33, True), (100, 600, False)])
def test_bulk_linear_matches_float64_like_torch(m, n, k, bias):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) * 0.1).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    ref = x.double() @ w.double().T + (b.double() if bias else 0.0)  # [m, n]
    y = cpu_linear.bulk_linear(x, cpu_linear.bulk_pack(w), b)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    bound = _bound(ref, x, w)
    assert bool(((y.double() - ref).abs() <= bound).all())
    assert bool(((F.linear(x, w, b).double() - ref).abs() <= bound).all())  # torch meets the same bound


def test_a_rows_result_does_not_depend_on_its_call():
    """Bitwise: a row alone, at another position, among 63 or 199 other rows, and in a [B, S, K] batch."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 600, generator=g).bfloat16()
    w = torch.randn(100, 600, generator=g).bfloat16()
    b = torch.randn(100, generator=g).bfloat16()
    packed = cpu_linear.bulk_pack(w)
    assert 200 % cpu_linear.BULK_ROWS  # more than one call, the last padded
    full = cpu_linear.bulk_linear(x, packed, b)  # [200, 100]
    for i in (0, 5, 63, 64, 131, 199):
        assert torch.equal(cpu_linear.bulk_linear(x[i:i + 1], packed, b)[0], full[i])
        others = torch.cat([x[i:i + 1], torch.randn(63, 600, generator=g).bfloat16()])
        assert torch.equal(cpu_linear.bulk_linear(others, packed, b)[0], full[i])
    assert torch.equal(cpu_linear.bulk_linear(x.view(4, 50, 600), packed, b).view(200, 100), full)


@pytest.mark.parametrize("m", [1, 129, 300])
def test_gated_mlp_is_the_three_calls_and_its_rows_do_not_depend_on_the_call(m):
    """``gated_mlp`` (a block of rows at a time) == ``down(silu(gate) * up)`` through ``linear``, bitwise; a row
    alone gives the same bits as among ``m`` rows."""
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 96, generator=g).bfloat16()
    w1 = (torch.randn(2 * 160, 96, generator=g) * 0.1).bfloat16()
    w2 = (torch.randn(96, 160, generator=g) * 0.1).bfloat16()
    p1, p2 = cpu_linear.bulk_pack(w1), cpu_linear.bulk_pack(w2)
    gate, up = cpu_linear.bulk_linear(x, p1, None).chunk(2, dim=-1)
    want = cpu_linear.bulk_linear(F.silu(gate) * up, p2, None)  # [m, 96]
    got = cpu_linear.gated_mlp(x.view(1, m, 96), p1, p2)
    assert got.shape == (1, m, 96) and torch.equal(got[0], want)
    assert torch.equal(cpu_linear.gated_mlp(x[-1:], p1, p2)[0], want[-1])


def test_packed_linear_takes_the_bulk_path_only_when_asked():
    w = torch.randn(45, 24).bfloat16()
    x = torch.randn(70, 24).bfloat16()
    layer = cpu_linear.PackedLinear(w, None, bulk=True)
    assert torch.equal(layer(x, bulk=True), cpu_linear.bulk_linear(x, layer.bulk_weight, None))
    assert torch.equal(layer(x), cpu_linear.linear(x, layer.packed, None, 45, layer.kind))
    plain = cpu_linear.PackedLinear(w, None)  # no oneDNN copy: bulk rows go to the kernel
    assert plain.bulk_weight is None and torch.equal(plain(x, bulk=True), layer(x))
    assert "bulk_weight" not in layer.state_dict()


def test_a_prefilled_prompt_does_not_depend_on_its_companions(tmp_path):
    """The engine's prefill forward of a prompt alone, or beside another prompt, in one or two chunks: the
    cache it leaves and the next decode's logits are bit-identical; the layers keep their oneDNN copies."""
    path = write_tiny_model(tmp_path / "m", vocab=300, seed=0, hidden=128, heads=4, kv_heads=2, intermediate=256,
                            init_std=0.3)
    model = avkit.models.load(path, dtype=torch.bfloat16).model
    assert model.layers[0].mlp.down.bulk_weight is not None and model.lm_head.bulk_weight is None
    g = torch.Generator().manual_seed(1)
    prompt, other = torch.randint(0, 300, (1, 90), generator=g), torch.randint(0, 300, (1, 90), generator=g)

    def fill(pieces: list[tuple[torch.Tensor, list[int]]]):
        cache = model.new_cache(3, 128)
        for tokens, slots in pieces:  # [B, S] runs of equal length, as runtime/prefill.py groups them
            model.forward(tokens, torch.full((len(slots),), tokens.shape[1]), torch.tensor(slots), cache,
                          logits=torch.zeros(len(slots), 0, dtype=torch.int64), prefill=True)
        nxt = model.forward(torch.tensor([[7]]), torch.tensor([1]), torch.tensor([2]), cache, logits="last")
        return cache.k[1][2, :, :90].clone(), nxt

    alone = fill([(prompt, [2])])
    beside = fill([(torch.cat([other, prompt]), [0, 2])])
    chunked = fill([(torch.cat([prompt[:, :40], other[:, :40]]), [2, 1]),
                    (torch.cat([prompt[:, 40:], other[:, 40:]]), [2, 1])])
    for got in (beside, chunked):
        assert torch.equal(got[0], alone[0]) and torch.equal(got[1], alone[1])


def test_ragged_prefill_computes_real_tokens_only_and_matches_each_run_alone(tmp_path):
    """runtime/prefill.py with ``ragged``: runs of 3 lengths (one longer than a chunk) share forwards, each
    forward's linears see only real tokens, and every slot's cache and next logits equal the run prefilled
    alone, bitwise; without ``ragged`` runs of unequal length never share a forward."""
    from avkit.runtime import prefill as pf

    path = write_tiny_model(tmp_path / "m", vocab=300, seed=0, hidden=128, heads=4, kv_heads=2, intermediate=256,
                            init_std=0.3)
    model = avkit.models.load(path, dtype=torch.bfloat16).model
    assert model.ragged_prefill
    g = torch.Generator().manual_seed(2)
    runs = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (150, 7, 61)]
    calls = []

    def forward(tokens, q_lens, slots, logits, prefill):
        rows = model.layers[0].attn.qkv
        seen = []
        plain = rows.forward
        rows.forward = lambda x, bulk=False: (seen.append(x.reshape(-1, x.shape[-1]).shape[0]), plain(x, bulk))[1]
        try:
            model.forward(tokens, q_lens, slots, cache, logits=logits, prefill=prefill)
        finally:
            del rows.forward
        calls.append((q_lens.tolist(), seen[0]))

    def state(slot):
        n = len(runs[slot])
        nxt = model.forward(torch.tensor([[7]]), torch.tensor([1]), torch.tensor([slot]), cache, logits="last")
        return cache.k[1][slot, :, :n].clone(), cache.v[0][slot, :, :n].clone(), nxt

    cache = model.new_cache(3, 200)
    pf.prefill(forward, runs, [0, 1, 2], chunk=100, ragged=True)
    assert calls == [([100, 7, 61], 168), ([50], 50)]  # one forward per chunk, pads never reach a linear
    together = [state(s) for s in range(3)]
    for s in range(3):
        cache = model.new_cache(3, 200)
        pf.prefill(forward, [runs[s] if i == s else [] for i in range(3)], [0, 1, 2], ragged=True)
        assert all(torch.equal(a, b) for a, b in zip(state(s), together[s]))
    calls.clear()
    cache = model.new_cache(3, 200)
    pf.prefill(forward, runs, [0, 1, 2], chunk=100)
    assert sorted(q for q, _ in calls) == [[7], [50], [61], [100]]
    assert pf._groups([[1] * 3000, [1] * 600, [1] * 2000], True, 512) == [[0, 1, 2]] and \
        pf._groups([[1] * 512] * 9, True, 512) == [list(range(8)), [8]]
