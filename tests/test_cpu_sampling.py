"""The CPU backend's vocabulary-row passes (avkit/models/native.py) against the torch code they replace.

The nucleus rule is compared bit for bit (same probabilities in, same threshold out, ties and every rung of the
ladder included); the softmax and the feature reductions to float tolerances (another exp, another summation
order), on odd vocabulary sizes, bf16 and float32 logits, -inf entries and tied maxima."""

import pytest
import torch

from avkit.features import draft_features
from avkit.runtime import sampling

from avkit.models import native

pytestmark = pytest.mark.skipif(not native.runs_here("sampling"), reason="CPU sampling kernel unavailable here")

@pytest.fixture(autouse=True, scope="module")
def _built():
    """Built here, at test time (once per machine and kernel version), not while the suite is collected."""
    if native.load("sampling") is None:
        pytest.skip("the CPU sampling kernel did not build here (no compiler or ninja)")


SIZES = (2, 7, 63, 64, 65, 1000, 1025, 9001, 40_003)


def _logits(n: int, v: int, seed: int) -> torch.Tensor:
    """Rows from peaked (an LM's usual nucleus of a few tokens) to near-flat (a nucleus past every rung)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([12.0, 6.0, 3.0, 1.0, 0.3, 0.02])[torch.arange(n) % 6, None]
    return torch.randn(n, v, generator=g) * scale


@pytest.mark.parametrize("v", SIZES)
def test_the_nucleus_threshold_is_top_p_threshold_bit_for_bit(v):
    torch.manual_seed(v)
    probs = torch.softmax(_logits(12, v, v), -1)
    probs[3, : min(v, 40)] = probs[3, 0]  # a tie across the boundary
    probs[4] = 1.0 / v  # all tied
    top_p = torch.tensor([0.5, 0.9, 0.95, 0.99, 0.7, 1.0, 0.3, 0.999, 0.05, 0.95, 0.9, 1e-6])
    got = native.load("sampling").nucleus_threshold(probs, top_p.float())
    assert torch.equal(got, sampling.top_p_threshold(probs, top_p))


@pytest.mark.parametrize("v", SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampled_probs_are_the_torch_softmax_cut_by_the_same_rule(v, dtype):
    """Its softmax (top_p = 1) is torch's to float tolerance; with top_p < 1 it is exactly top_p_threshold's cut
    of that softmax, renormalised."""
    logits = _logits(12, v, 1).to(dtype)
    logits[1, v // 2] = float("-inf")
    t = torch.tensor([0.5, 1.0, 1.7, 1.0, 0.8, 2.0] * 2)
    top_p = torch.tensor([0.3, 0.9, 0.95, 1.0, 0.999, 0.5, 0.95, 0.99, 0.6, 0.9, 0.2, 1.0])
    full = native.sampled_probs(logits, t, torch.ones(12))
    torch.testing.assert_close(full, torch.softmax(logits.float() / t[:, None], -1), atol=1e-7, rtol=1e-5)
    got = native.sampled_probs(logits, t, top_p)
    cut = full.masked_fill(full < sampling.top_p_threshold(full, top_p)[:, None], 0.0)
    assert torch.equal(got > 0, cut > 0)
    torch.testing.assert_close(got, cut / cut.sum(-1, keepdim=True), atol=1e-7, rtol=1e-5)
    assert full[1, v // 2] == 0 and torch.allclose(got.double().sum(-1), torch.ones(12, dtype=torch.float64))


def test_peaked_rows_keep_the_same_tokens_as_the_torch_path(monkeypatch):
    """Where an LM's nucleus usually ends (a few to a few hundred tokens, boundary far from float ties) the native
    path keeps exactly the tokens the torch path keeps, a vocabulary of Qwen's size."""
    logits = _logits(6, 151_936, 3)[:4]
    t, top_p = torch.tensor([0.7, 1.0, 1.0, 1.3]), torch.tensor([0.95, 0.9, 0.5, 0.95])
    fast = sampling.probs_from_logits(logits, t, top_p, greedy=False)
    monkeypatch.setattr(native, "sampling_usable", lambda logits: False)
    ref = sampling.probs_from_logits(logits, t, top_p, greedy=False)
    assert torch.equal(fast > 0, ref > 0)
    torch.testing.assert_close(fast, ref, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("v", SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_draft_features_agree_with_the_torch_reductions(v, dtype, monkeypatch):
    logits = _logits(6, v, 2).reshape(2, 3, v).to(dtype)  # [B, K, V]
    logits[0, 0, v - 1] = float("-inf")
    if v > 2:
        logits[1, 1, :2] = 30.0  # a tied maximum: m2 = m
    t = torch.tensor([0.0, 0.7])  # T = 0 reads as 1
    fast = draft_features(logits, t)
    monkeypatch.setattr(native, "sampling_usable", lambda logits: False)
    ref = draft_features(logits, t)
    for name in ref:
        torch.testing.assert_close(fast[name], ref[name], atol=2e-6, rtol=2e-5, msg=name)


def test_a_certain_draft_keeps_its_tiny_others_mass():
    """q_max -> 1: s_o is summed without the argmax (no 1 + s_o cancellation), so logit_qmax = -log s_o holds."""
    logits = torch.full((1, 1000), -30.0)
    logits[0, 7] = 0.0
    f = draft_features(logits, 1.0)
    expected = -torch.log(torch.tensor(999.0, dtype=torch.float64)) + 30.0
    assert abs(float(f["logit_qmax"][0]) - float(expected)) < 1e-4


def test_bad_inputs_name_the_argument():
    with pytest.raises(RuntimeError, match="temperature"):
        native.sampled_probs(torch.randn(3, 10), torch.ones(2), torch.ones(3))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        native.row_stats(torch.randn(3, 10, dtype=torch.float64), torch.ones(3))
