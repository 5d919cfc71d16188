"""Draft features against a float64 softmax oracle; exactness as q_max -> 1; lossless flags."""

import math

import numpy as np
import polars as pl
import pytest
import torch

from avkit.errors import DataError
from avkit.features import CLAMP, FEATURES, LOGIT_FEATURES, draft_features


def _oracle(logits: torch.Tensor, t: float) -> dict[str, torch.Tensor]:
    q = torch.softmax(logits.double() / (1.0 if t == 0 else t), dim=-1)
    top = q.topk(2, dim=-1).values
    return {
        "q_max": top[..., 0],
        "q_2nd": top[..., 1],
        "entropy": torch.special.entr(q).sum(-1),
        "logit_qmax": torch.logit(top[..., 0]),
        "log_margin": torch.log(top[..., 0]) - torch.log(top[..., 1]),
        "neg_log_neg_log_qmax": -torch.log(-torch.log(top[..., 0])),
    }


@pytest.mark.parametrize("shape", [(5,), (3, 7), (2, 3, 33), (1, 1, 2)])
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 1.6])
def test_matches_float64_oracle(shape, temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(shape, generator=g) * 3
    got = draft_features(logits, temperature)
    want = _oracle(logits, temperature)
    assert set(got) == set(LOGIT_FEATURES)
    for name, w in want.items():
        assert got[name].shape == shape[:-1], name
        assert got[name].dtype == torch.float32
        torch.testing.assert_close(got[name].double(), w, atol=2e-5, rtol=2e-5, msg=name)


def test_logit_qmax_exact_as_q_goes_to_one():
    # q_max = 1 - 1e-12 rounds to 1 in float32; logit(q_max) = 30 - log(V - 1) exactly.
    v = 1000
    logits = torch.zeros(v)
    logits[17] = 30.0
    f = draft_features(logits, 1.0)
    assert float(f["q_max"]) == 1.0  # the naive logit would be +inf
    assert float(f["logit_qmax"]) == pytest.approx(30 - math.log(v - 1), abs=1e-4)
    assert float(f["neg_log_neg_log_qmax"]) == pytest.approx(30 - math.log(v - 1), abs=1e-4)


def test_clamped_and_finite_with_masked_logits():
    logits = torch.full((2, 6), float("-inf"))
    logits[0, 1] = 200.0
    logits[0, 2] = 0.0
    logits[1, 3] = 1.0  # a single finite logit: q_max = 1, the others have no mass
    f = draft_features(logits, 1.0)
    for name, x in f.items():
        assert torch.isfinite(x).all(), name
    assert f["logit_qmax"].tolist() == [CLAMP, CLAMP]
    assert f["log_margin"].tolist() == [CLAMP, CLAMP]
    assert f["entropy"].tolist() == [0.0, 0.0]


def test_per_request_temperature_broadcasts_over_leading_dims():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 4, 50, generator=g)
    temps = torch.tensor([0.0, 0.5, 2.0])  # [B] for logits [B, K, V]
    got = draft_features(logits, temps)
    for b, t in enumerate(temps.tolist()):
        row = draft_features(logits[b], t)
        for name in LOGIT_FEATURES:
            assert torch.equal(got[name][b], row[name]), name


@pytest.mark.parametrize("bad", [torch.ones(4), torch.tensor([1.0, -1.0, 1.0]), float("nan")])
def test_bad_temperature_raises(bad):
    with pytest.raises(DataError, match="temperature"):
        draft_features(torch.zeros(3, 5), bad)


def test_vocab_of_one_raises():
    with pytest.raises(DataError, match="logits"):
        draft_features(torch.zeros(3, 1), 1.0)


def test_lossless_flags():
    lossy = {n for n, s in FEATURES.items() if not s.lossless}
    assert lossy == {"logit_q_sampled", "neg_log_neg_log_q_sampled"}
    assert {"logit_qmax", "log_margin", "entropy", "neg_log_neg_log_qmax", "q_max", "head_conf"} <= set(FEATURES)


def test_trace_expressions_agree_with_logit_features():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(400, 64, generator=g) * 2.5
    f = draft_features(logits, 0.8)
    q = torch.softmax(logits.double() / 0.8, -1)
    q_sampled = q.gather(-1, torch.multinomial(q, 1, generator=g)).squeeze(-1)
    frame = pl.DataFrame({k: f[k].numpy() for k in ("logit_qmax", "q_max", "q_2nd", "entropy")}
                         | {"q_sampled": q_sampled.float().numpy()})
    for name in ("logit_qmax", "log_margin", "entropy", "neg_log_neg_log_qmax", "q_max"):
        got = frame.select(FEATURES[name].expr).to_series().to_numpy()
        np.testing.assert_allclose(got, f[name].double().numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
    qs = q_sampled.numpy()
    want = {"logit_q_sampled": np.log(qs / (1 - qs)), "neg_log_neg_log_q_sampled": -np.log(-np.log(qs))}
    for name, w in want.items():
        got = frame.select(FEATURES[name].expr).to_series().to_numpy()
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-4, err_msg=name)
