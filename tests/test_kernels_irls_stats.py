"""IRLS-statistics kernel: Triton (interpreted on CPU) vs the reference vs a dense-matrix oracle.

Tolerance Triton vs reference: float32 sums inside 1024-row blocks against float64 sums, rtol 1e-5
and atol 1e-4 (sums of up to ~3000 terms of size <= ~10); the counts n are exact.
"""


import numpy as np
import pytest
import torch

from avkit.errors import DataError
from avkit.estimators.irls import STATS
from avkit.kernels.irls_stats_ref import irls_stats_ref

# On CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_round(steps, B, K, dtype=torch.float32, seed=0):
    """A refit round as the engine produces it: [steps * B, K] slots, labels NaN where censored."""
    g = torch.Generator().manual_seed(seed)
    f = (torch.randn(steps * B, K, generator=g) * 3).to(dtype)  # feature, e.g. logit(q_max)
    p = torch.sigmoid(0.5 * f.float() - 0.2)  # prediction made when drafting
    accepted = torch.rand(steps * B, K, generator=g) < p
    n_acc = torch.cumprod(accepted.long(), 1).sum(1)  # accepted prefix
    num_verify = torch.randint(0, K + 1, (steps * B,), generator=g)
    j = torch.arange(K)
    observed = (j < num_verify[:, None]) & (j <= n_acc[:, None])
    labels = torch.where(observed, (j < n_acc[:, None]).float(), torch.full_like(p, float("nan")))
    return f, j, p, labels, observed


def to_dev(*ts):
    return [t.to(DEVICE) for t in ts]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 5])
@pytest.mark.parametrize("K", [1, 7])
def test_triton_matches_reference(kernels, K, B, dtype):
    f, j, p, y, obs = make_round(100, B, K, dtype, seed=K * 10 + B)  # up to 3500 slots: 4 blocks
    got = kernels.irls_stats(*to_dev(f, j, p, y, obs), K)
    want = irls_stats_ref(f, j, p, y, obs, K)
    for name in ("a", "b", "c", "g0", "g1"):
        torch.testing.assert_close(getattr(got, name).cpu(), getattr(want, name), rtol=1e-5, atol=1e-4)
    assert torch.equal(got.n.cpu(), want.n)


def test_stats_are_the_blocks_of_the_dense_newton_system():
    # Oracle: X = [f, onehot(position)] over observed rows, W = diag(p(1-p)), r = y - p.
    # X^T W X has sum(a) in the corner, b on the border, c on the diagonal; X^T r = [sum g0, g1].
    K = 4
    f, j, p, y, obs = make_round(30, 3, K, seed=1)
    s = irls_stats_ref(f, j, p, y, obs, K)
    m = obs.numpy()
    fo = f.numpy()[m].astype(np.float64)
    po = p.numpy()[m].astype(np.float64)
    X = np.column_stack([fo, np.eye(K)[np.broadcast_to(j.numpy(), m.shape)[m]]])  # [M, 1+K]
    w, r = po * (1 - po), y.numpy()[m] - po
    H, g = X.T @ (w[:, None] * X), X.T @ r
    np.testing.assert_allclose(H[0, 0], s.a.sum().item(), rtol=1e-9)
    np.testing.assert_allclose(H[0, 1:], s.b.numpy(), rtol=1e-9)
    np.testing.assert_allclose(np.diag(H)[1:], s.c.numpy(), rtol=1e-9)
    np.testing.assert_allclose(g, np.r_[s.g0.sum().item(), s.g1.numpy()], rtol=1e-9, atol=1e-12)
    assert s.n.tolist() == np.bincount(np.broadcast_to(j.numpy(), m.shape)[m], minlength=K).tolist()


def test_censored_rows_and_empty_positions(kernels):
    f, j, p, y, obs = make_round(5, 2, 3, seed=2)
    obs[:, 2] = False  # position 2 never observed: all its sums are exactly 0
    y[~obs] = float("nan")
    for fn in (irls_stats_ref, kernels.irls_stats):
        s = fn(*to_dev(f, j, p, y, obs), 3)
        assert all(float(getattr(s, name)[2]) == 0.0 for name in STATS)
        assert all(torch.isfinite(getattr(s, name)).all() for name in STATS)


def test_bad_positions_named():
    with pytest.raises(DataError, match="observed positions must be in"):
        irls_stats_ref(torch.ones(3), torch.tensor([0, 1, 5]), torch.full((3,), 0.5), torch.ones(3),
                       torch.ones(3, dtype=torch.bool), 2)
    with pytest.raises(DataError, match="do not broadcast"):
        irls_stats_ref(torch.ones(3), torch.zeros(2, dtype=torch.int64), torch.ones(3), torch.ones(3),
                       torch.ones(3, dtype=torch.bool), 2)


def test_agrees_with_estimator_statistics():
    irls = pytest.importorskip("avkit.estimators.irls")
    K = 7
    f, j, p, y, obs = make_round(20, 4, K, seed=3)
    s = irls_stats_ref(f, j, p, y, obs, K)
    m = obs.numpy()
    pos = np.broadcast_to(j.numpy(), m.shape)[m]
    want = irls.irls_stats(f.numpy()[m].astype(np.float64), pos, p.numpy()[m].astype(np.float64),
                           y.numpy()[m].astype(np.float64), K)
    for name in ("a", "b", "c", "g0", "g1"):
        np.testing.assert_allclose(getattr(s, name).numpy(), getattr(want, name), rtol=1e-9, atol=1e-12)
    assert s.n.tolist() == want.n.tolist()
