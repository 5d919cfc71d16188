"""Rejection-sampling kernel: bit-exact against `avkit.kernels.rejection_ref.rejection_sample_ref`, and lossless.

Integer outputs (tokens, accepted lengths, accepted/observed masks) must be identical, and so must
target_prob (a gather: no arithmetic). The chi-square tests run the Triton kernel itself.
"""


import pytest
import torch

from avkit.errors import DataError
from avkit.kernels.rejection_ref import rejection_sample_ref

# On CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy overflow notes in the interpreter


def make_step(B, K, V, dtype, greedy, seed=0):
    """A verification step: target/draft probs, drafts drawn from q (greedy: often the argmax)."""
    g = torch.Generator().manual_seed(seed)
    lt = torch.randn(B, K + 1, V, generator=g) * 2.0  # [B, K+1, V]
    ld = lt[:, :K] + torch.randn(B, K, V, generator=g)  # a correlated draft
    tp, dp = lt.softmax(-1).to(dtype), ld.softmax(-1).to(dtype)
    x = torch.multinomial(dp.float().reshape(-1, V), 1, generator=g).reshape(B, K)  # [B, K]
    if greedy:
        x = torch.where(torch.rand(B, K, generator=g) < 0.8, tp[:, :K].float().argmax(-1), x)
    num_verify = torch.randint(0, K + 1, (B,), generator=g)
    keys = {"seeds": torch.randint(-2**40, 2**40, (B,), generator=g), "request_keys": torch.arange(B) + 11,
            "positions": torch.randint(0, 4096, (B,), generator=g)}
    return (tp, dp, x, num_verify), keys


def run(fn, args, keys, greedy, **kw):
    keys = {k: v.to(DEVICE) for k, v in keys.items()}
    r = fn(*(a.to(DEVICE) for a in args), greedy=greedy, **keys, **kw)
    return [t.cpu() for t in (r.output_tokens, r.num_accepted, r.accepted, r.observed, r.target_prob)]


def assert_identical(got, want):
    for name, a, b in zip(("output_tokens", "num_accepted", "accepted", "observed"), got, want):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{name}: {a.tolist()} != {b.tolist()}"
    assert torch.equal(got[4].nan_to_num(-1.0), want[4].nan_to_num(-1.0)), "target_prob"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 5])
@pytest.mark.parametrize("K", [1, 7])
@pytest.mark.parametrize("V", [1000, 4099])
def test_probabilistic_bit_exact(kernels, V, K, B, dtype):
    args, keys = make_step(B, K, V, dtype, greedy=False, seed=V + 10 * K + B)
    want = run(rejection_sample_ref, args, keys, False)
    assert_identical(run(kernels.rejection_sample, args, keys, False), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("K", [1, 7])
@pytest.mark.parametrize("V", [1000, 4099])
def test_greedy_bit_exact(kernels, V, K, dtype):
    args, keys = make_step(5, K, V, dtype, greedy=True, seed=V + K)
    args[0][0, 0, [7, V - 1]] = 2.0  # a tie for the top across vocabulary blocks: the lower index wins
    want = run(rejection_sample_ref, args, keys, True)
    assert_identical(run(kernels.rejection_sample, args, keys, True), want)
    # an all-greedy batch's drafters hand over no q ([B, K, 0], DraftInput.q_width): same result
    lean = (args[0], args[1][:, :, :0], *args[2:])
    assert_identical(run(kernels.rejection_sample, lean, keys, True), want)
    assert_identical(run(rejection_sample_ref, lean, keys, True), want)


def test_bad_shapes_raise_on_both_paths(kernels):
    args, keys = make_step(2, 3, 50, torch.float32, greedy=False)
    keys["positions"] = keys["positions"][:1]
    for fn in (rejection_sample_ref, kernels.rejection_sample):
        with pytest.raises(DataError, match=r"positions must have shape \[2\], got \(1,\)"):
            run(fn, args, keys, False)
    with pytest.raises(DataError, match=r"must be \[B, K\+1, V\] and \[B, K, V\]"):
        run(rejection_sample_ref, (args[0], args[1][:, :, :0], *args[2:]), {**keys, "positions": keys["seeds"]}, False)


def test_small_vocab_blocks_and_no_drafts(kernels):
    from avkit.kernels.rejection import rejection_sample_triton

    args, keys = make_step(3, 3, 1000, torch.float32, greedy=False, seed=5)
    want = run(rejection_sample_ref, args, keys, False)
    assert_identical(run(rejection_sample_triton, args, keys, False, block_v=128), want)  # 8 blocks
    args, keys = make_step(3, 0, 1000, torch.float32, greedy=False, seed=6)  # K = 0: target-only
    want = run(rejection_sample_ref, args, keys, False)
    assert_identical(run(kernels.rejection_sample, args, keys, False), want)


def test_rows_do_not_depend_on_batch_composition(kernels):
    args, keys = make_step(5, 7, 1000, torch.float32, greedy=False, seed=7)
    full = run(kernels.rejection_sample, args, keys, False)
    sub = [1, 3]
    alone = run(kernels.rejection_sample, [a[sub] for a in args], {k: v[sub] for k, v in keys.items()}, False)
    assert_identical(alone, [t[sub] for t in full])


def first_tokens(kernels, p, q, num_verify, n, seed):
    """First emitted token of n independent requests (distinct request keys) through the kernel."""
    g = torch.Generator().manual_seed(seed)
    K, V = q.shape
    tp = p.expand(n, K + 1, V).contiguous()  # [n, K+1, V]: i.i.d. toy target, same p_j for all requests
    dp = q.expand(n, K, V).contiguous()
    x = torch.stack([torch.multinomial(q[j], n, replacement=True, generator=g) for j in range(K)], 1)
    # x: [n, K] drafts drawn from q, independently per slot
    nv = num_verify(x)
    z = torch.zeros(n, dtype=torch.int64)
    keys = {"seeds": z + seed, "request_keys": torch.arange(n), "positions": z}
    out = run(kernels.rejection_sample, (tp, dp, x, nv), keys, False)[0]
    return torch.bincount(out[:, 0], minlength=V)  # [V]


def test_chi_square_lossless_through_kernel(kernels):
    # K = 2, V = 5; num_verify depends on the request only (lossless): 0, 1 or 2 by index.
    # 160 samples: chi-square against p_0 must not reject at alpha = 1e-3 (fixed seed); the same
    # sample size rejects the biased rule below at p < 1e-4.
    from scipy.stats import chisquare  # lazy: heavy, imported by the tests that use it
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(3, 5, generator=g) * 0.6, -1)  # [K+1, V], every expected count >= 5
    q = torch.softmax(torch.randn(2, 5, generator=g) * 1.0, -1)  # [K, V]
    counts = first_tokens(kernels, p, q, lambda x: torch.arange(len(x)) % 3, 160, seed=1)
    p0 = p[0].double()
    assert chisquare(counts.numpy(), (160 * p0 / p0.sum()).numpy()).pvalue > 1e-3


def test_chi_square_detects_trimming_on_q_sampled(kernels):
    # docs/lossless.md: deciding num_verify from q(x_sampled) biases the output. p = [.5, .5],
    # q = [.4, .6], verify only when q(x) >= .5: P(a) = .4 * .5 + .6 * (1 - .5/.6) = 0.3, not 0.5.
    # 160 samples (expected chi-square 26.6 on 1 df): the observed rate is within 4 sigma of 0.3
    # and chi-square rejects p at p < 1e-4.
    from scipy.stats import chisquare  # lazy: heavy, imported by the tests that use it
    p, q = torch.tensor([[0.5, 0.5], [0.5, 0.5]]), torch.tensor([[0.4, 0.6]])
    counts = first_tokens(kernels, p, q, lambda x: (q[0][x[:, 0]] >= 0.5).long(), 160, seed=2)
    rate, sigma = counts[0].item() / 160, (0.3 * 0.7 / 160) ** 0.5
    assert abs(rate - 0.3) < 4 * sigma
    assert chisquare(counts.numpy(), [80.0, 80.0]).pvalue < 1e-4
