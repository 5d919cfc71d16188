"""The CPU backend's bf16 kernels (avkit/models/cpu_linear.cpp, and cpu_linear512.cpp where the CPU has
AVX512-BF16) against float64 matmuls and F.linear; each kernel that runs here is tested.

Oracle: the exact product in float64, rounded once to bf16. The kernel sums in fp32, so each output may
differ from that rounding by one bf16 step plus the fp32 summation error; torch's own bf16 F.linear has
the same allowance and is checked against the same bound, so the test cannot pass a kernel that is
worse than torch. Skipped where the kernel cannot build (no AVX2 or no compiler).
"""

import pytest
import torch
import torch.nn.functional as F

import avkit.models
from avkit.models import cpu_linear, native
from avkit.models.testing import write_tiny_model

pytestmark = pytest.mark.skipif(not native.runs_here("avx2"), reason="CPU bf16 kernel unavailable here")
KINDS = [k for k in cpu_linear.KINDS if native.runs_here(k)]  # each test skips one that did not build

@pytest.fixture(autouse=True, scope="module")
def _built():
    """Built here, at test time (once per machine and kernel version), not while the suite is collected."""
    if not (cpu_linear.available()):
        pytest.skip("the CPU bf16 kernel did not build here (no compiler or ninja)")



def _needs(kind: str) -> None:
    if kind not in cpu_linear.kinds():  # may run here, did not build (or the OS refuses AMX tiles)
        pytest.skip(f"{kind} kernel unavailable here")


def _bound(ref64: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per output: one bf16 rounding step of the result + fp32 summation error of K products."""
    step = ref64.abs() * 2.0 ** -8
    sum_err = (x.double().abs() @ w.double().abs().T) * x.shape[-1] * 2.0 ** -23
    return step + sum_err + 1e-30


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 6, 7, 8, 13, 25])
@pytest.mark.parametrize(("n", "k", "bias"), [(37, 100, True), (64, 96, False), (130, 33, True), (100, 600, False),
                                              (300, 601, True)])
def test_kernel_matches_float64_like_torch(kind, m, n, k, bias):
    _needs(kind)
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) * 0.1).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    ref = x.double() @ w.double().T + (b.double() if bias else 0.0)  # [m, n]
    y = cpu_linear.linear(x, cpu_linear.pack(w, kind), b, n, kind)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    bound = _bound(ref, x, w)
    assert bool(((y.double() - ref).abs() <= bound).all())
    assert bool(((F.linear(x, w, b).double() - ref).abs() <= bound).all())  # torch meets the same bound


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 8, 13, 25])
def test_rows_do_not_depend_on_the_batch(kind, rows):
    """Batch invariance: a row's output is bit-identical alone or among others, whatever the tile shape.

    K = 600 spans three k-blocks of the AVX2 kernel (the last partial) and three of 128 pairs of the AVX512 one,
    N = 100 is 7 panels (groups of 8, 4 or 2 panels at one, two or more rows leave a partial group), and 30 rows
    split into 10 + 10 + 10 (12-row tiles) or 6 x 5 (6-row tiles) while 8 split into 8 or 4 + 4.
    """
    _needs(kind)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 600, generator=g).bfloat16()
    w = torch.randn(100, 600, generator=g).bfloat16()
    packed = cpu_linear.pack(w, kind)
    full = cpu_linear.linear(x, packed, None, 100, kind)
    for i in (0, 5, 6, 30 - rows):
        assert torch.equal(cpu_linear.linear(x[i:i + rows], packed, None, 100, kind), full[i:i + rows])


@pytest.mark.parametrize("kind", KINDS)
def test_unpack_inverts_pack(kind):
    _needs(kind)
    w = torch.randn(45, 25).bfloat16()  # N and K off the panel and pair sizes
    assert torch.equal(cpu_linear.unpack(cpu_linear.pack(w, kind), 45, 25), w)


def test_pack_round_trips_and_leading_dims():
    w = torch.randn(45, 24).bfloat16()
    layer = cpu_linear.PackedLinear(w, None)
    assert torch.equal(layer.unpacked(), w)
    x = torch.randn(2, 3, 24).bfloat16()
    assert layer(x).shape == (2, 3, 45)
    assert torch.equal(layer(x).reshape(6, 45), cpu_linear.linear(x.reshape(6, 24), layer.packed, None, 45, layer.kind))


def _load_plain(path, monkeypatch):
    """The same bf16 model through plain F.linear (the kernel switched off while it loads)."""
    monkeypatch.setenv("AVKIT_CPU_KERNELS", "0")
    native.load.cache_clear()
    try:
        return avkit.models.load(path, dtype=torch.bfloat16).model
    finally:
        monkeypatch.delenv("AVKIT_CPU_KERNELS")
        native.load.cache_clear()


@pytest.mark.parametrize("tied", [True, False])
def test_bf16_model_uses_packed_weights_and_matches_plain_path(tmp_path, monkeypatch, tied):
    """A bf16 model on CPU packs its linears; its logits match the F.linear path within bf16 noise."""
    path = write_tiny_model(tmp_path / "m", arch="qwen2", vocab=300, seed=3, tie_word_embeddings=tied,
                            init_std=0.1)
    plain = _load_plain(path, monkeypatch)
    packed = avkit.models.load(path, dtype=torch.bfloat16).model
    assert isinstance(packed.layers[0].mlp.down, cpu_linear.PackedLinear)
    assert not any(isinstance(m, cpu_linear.PackedLinear) for m in plain.modules())
    assert not any(isinstance(m, cpu_linear.PackedLinear) for m in avkit.models.load(path).model.modules())  # fp32
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 300, (3, 9), generator=g)
    outs = []
    for model in (packed, plain):
        cache = model.new_cache(3, 16)
        outs.append(model.forward(tokens, torch.tensor([9, 4, 7]), torch.arange(3), cache))
    valid = torch.arange(9)[None, :] < torch.tensor([9, 4, 7])[:, None]
    scale = float(outs[1][valid].abs().max())
    assert float((outs[0] - outs[1])[valid].abs().max()) <= 0.03 * scale


def test_bf16_greedy_speculative_output_equals_target_only(tmp_path):
    """Through the packed kernel, verify forwards (1 + k rows) give the logits one-token decodes give, so
    greedy speculative decoding reproduces greedy target-only decoding token for token in bf16 too."""
    from avkit.config import EngineConfig, SamplingConfig
    from avkit.runtime.engine import Engine
    from avkit.runtime.request import Request

    target = avkit.models.load(write_tiny_model(tmp_path / "t", vocab=300, seed=5, init_std=0.3), dtype=torch.bfloat16)
    draft = avkit.models.load(write_tiny_model(tmp_path / "d", vocab=300, seed=6, init_std=0.3), dtype=torch.bfloat16)
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=24, seed=0)
    reqs = [Request(f"r{i}", list(range(1 + i, 9 + 3 * i)), sampling) for i in range(3)]
    outs = {}
    for k in (0, 3):
        engine = Engine(target, draft if k else None, EngineConfig(k=k, concurrency=3, max_len=64))
        outs[k] = [g.output_ids for g in engine.generate(reqs)]
    assert outs[3] == outs[0]


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    import os
    import time

    from avkit.models.native import clear_stale_build_lock

    assert clear_stale_build_lock(tmp_path) is False  # no lock
    lock = tmp_path / "lock"
    lock.touch()
    assert clear_stale_build_lock(tmp_path) is False and lock.exists()  # a build may be running
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="stale build lock"):
        assert clear_stale_build_lock(tmp_path) is True
    assert not lock.exists()
