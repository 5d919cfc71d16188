"""PayoffMLP: beats the mean predictor on held-out data, seeded runs reproduce, overfits a tiny batch,
survival head is a valid survival curve, save/load round-trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from avkit.config import PayoffConfig
from avkit.errors import DataError
from avkit.hvd.payoff_mlp import PayoffMLP

NAMES = ("a", "b", "draft_len")


def _data(n: int, seed: int, k: int = 7):
    """Accepted length depends nonlinearly on a, b and is capped by the draft length."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), rng.normal(size=n)
    dl = rng.integers(1, k + 1, n)
    mean = np.clip(dl * (1 / (1 + np.exp(-2 * a))) * (b > 0), 0, dl)  # [N]
    y = np.clip(np.round(mean + rng.normal(0, 0.5, n)), 0, dl)
    return np.stack([a, b, dl], 1).astype(np.float32), y.astype(np.float32)


@pytest.mark.parametrize("head", ["mean", "survival"])
def test_beats_mean_on_validation(head):
    x, y = _data(2000, 0)
    xv, yv = _data(600, 1)
    m = PayoffMLP(NAMES, 7, PayoffConfig(epochs=12, batch_size=256), head=head).fit(x, y, xv, yv)
    mse = np.mean((m.predict(xv) - yv) ** 2)
    baseline = np.mean((y.mean() - yv) ** 2)
    assert mse < 0.5 * baseline, (mse, baseline)  # margin: the signal explains well over half the variance


def test_seeded_training_is_reproducible():
    x, y = _data(800, 2)
    cfg = PayoffConfig(epochs=3, batch_size=128, seed=7)
    torch.manual_seed(123)  # global RNG must not matter
    p1 = PayoffMLP(NAMES, 7, cfg).fit(x, y).predict(x)
    torch.manual_seed(456)
    p2 = PayoffMLP(NAMES, 7, cfg).fit(x, y).predict(x)
    p3 = PayoffMLP(NAMES, 7, PayoffConfig(epochs=3, batch_size=128, seed=8)).fit(x, y).predict(x)
    assert np.array_equal(p1, p2)
    assert not np.allclose(p1, p3)


def test_overfits_tiny_batch():
    x, y = _data(32, 3)
    m = PayoffMLP(NAMES, 7, PayoffConfig(epochs=400, batch_size=32, lr=1e-2, weight_decay=0.0)).fit(x, y)
    assert np.mean((m.predict(x) - y) ** 2) < 0.05 * y.var()


def test_survival_curve_is_valid():
    x, y = _data(500, 4)
    m = PayoffMLP(NAMES, 7, PayoffConfig(epochs=2), head="survival").fit(x, y)
    s = m.predict_survival(x)  # [N, K]
    assert s.shape == (500, 7)
    assert (np.diff(s, axis=1) <= 1e-7).all()  # non-increasing in j
    assert ((s >= 0) & (s <= 1)).all()
    beyond = np.arange(1, 8)[None, :] > x[:, 2:3]
    assert (s[beyond] == 0).all()
    np.testing.assert_allclose(m.predict(x), s.sum(1), rtol=1e-6)


def test_save_load_roundtrip(tmp_path):
    x, y = _data(300, 5)
    m = PayoffMLP(NAMES, 7, PayoffConfig(epochs=2)).fit(x, y)
    m.save(tmp_path / "p.pt", tau=1.5)
    m2, extra = PayoffMLP.load(tmp_path / "p.pt")
    assert extra == {"tau": 1.5}
    assert m2.feature_names == NAMES
    assert np.array_equal(m.predict(x), m2.predict(x))


def test_bad_input_names_the_problem():
    m = PayoffMLP(NAMES, 7)
    with pytest.raises(DataError, match=r"expected shape \[N, 3\]"):
        m.predict(np.zeros((4, 2)))
    x = np.zeros((4, 3), dtype=np.float32)
    x[1, 0] = np.nan
    with pytest.raises(DataError, match="non-finite"):
        m.fit(x, np.zeros(4))
