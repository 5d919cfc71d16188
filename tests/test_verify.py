"""Rejection sampling reference: against a slow per-row loop oracle, greedy rules, key-determinism."""

from __future__ import annotations

import math

import pytest
import torch

from avkit.kernels.rng import STREAM_ACCEPT, uniform
from avkit.kernels.rejection_ref import exponential_race, rejection_sample_ref

torch.set_num_threads(1)


def _random_case(B, K, V, seed, peaky=3.0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(B, K + 1, V, generator=g) * peaky, -1)
    q = torch.softmax(torch.randn(B, K, V, generator=g) * peaky, -1)
    x = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, K)
    k = torch.randint(0, K + 1, (B,), generator=g)
    keys = {"seeds": torch.full((B,), seed, dtype=torch.int64), "request_keys": torch.arange(B) * 7 + 1,
                "positions": torch.randint(0, 1000, (B,), generator=g)}
    return p, q, x, k, keys


def _oracle_row(p, q, x, k, seed, key, pos, greedy):
    """Textbook speculative sampling for one request, written as a loop."""
    out, acc = [], []
    for j in range(k):
        if greedy:
            ok = int(x[j]) == int(p[j].argmax())
        else:
            u = float(uniform(seed, key, pos + j, STREAM_ACCEPT, 0))
            ok = u < float(p[j, x[j]]) / float(q[j, x[j]])
        if not ok:
            break
        out.append(int(x[j]))
        acc.append(True)
    n = len(out)
    if greedy:
        y = int(p[n].argmax())
    else:
        r = (p[n] - q[n]).clamp_min(0) if n < k else p[n]
        if float(r.sum()) <= 0:
            r = p[n]
        y = int(exponential_race(r[None], torch.tensor([seed]), torch.tensor([key]), torch.tensor([pos + n])))
    return out + [y], n


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("B,K,V", [(1, 1, 2), (5, 3, 17), (9, 7, 50)])
def test_matches_loop_oracle(B, K, V, greedy):
    p, q, x, k, keys = _random_case(B, K, V, seed=B * 100 + K)
    if greedy:  # make some drafts the target's argmax so acceptances happen
        x = torch.where(torch.rand(B, K, generator=torch.Generator().manual_seed(1)) < 0.7,
                        p[:, :K].argmax(-1), x)
    res = rejection_sample_ref(p, q, x, k, greedy=greedy, **keys)
    for b in range(B):
        toks, n = _oracle_row(p[b], q[b], x[b], int(k[b]), int(keys["seeds"][b]),
                              int(keys["request_keys"][b]), int(keys["positions"][b]), greedy)
        assert int(res.num_accepted[b]) == n
        assert res.output_tokens[b, : n + 1].tolist() == toks
        assert (res.output_tokens[b, n + 1:] == -1).all()
        assert res.accepted[b].tolist() == [j < n for j in range(K)]
        assert res.observed[b].tolist() == [j < int(k[b]) and j <= n for j in range(K)]
        verified = torch.arange(K) < k[b]
        assert torch.isnan(res.target_prob[b, ~verified]).all()
        # greedy: the target distribution is one-hot at the argmax, p(x_j) = 1[x_j = argmax p_j]
        p_x = (x[b] == p[b, :K].argmax(-1)).float() if greedy else p[b, torch.arange(K), x[b]]
        torch.testing.assert_close(res.target_prob[b, verified], p_x[verified])


def test_k_zero_is_plain_sampling():
    p, q, x, k, keys = _random_case(4, 0, 11, seed=3)
    res = rejection_sample_ref(p, q, x, k, greedy=False, **keys)
    assert res.output_tokens.shape == (4, 1) and (res.num_accepted == 0).all()
    expected = exponential_race(p[:, 0], keys["seeds"], keys["request_keys"], keys["positions"])
    assert res.output_tokens[:, 0].tolist() == expected.tolist()


def test_identical_distributions_accept_everything():
    p, q, x, _k, keys = _random_case(6, 4, 13, seed=4)
    q = p[:, :4].clone()
    res = rejection_sample_ref(p, q, x, torch.full((6,), 4), greedy=False, **keys)
    assert (res.num_accepted == 4).all()  # u < p/q = 1 always


def test_result_depends_only_on_row_keys():
    """A row's outcome is the same alone or inside a larger batch (counter-based random numbers)."""
    p, q, x, k, keys = _random_case(8, 5, 31, seed=5)
    full = rejection_sample_ref(p, q, x, k, greedy=False, **keys)
    for b in (0, 3, 7):
        one = rejection_sample_ref(p[b:b + 1], q[b:b + 1], x[b:b + 1], k[b:b + 1], greedy=False,
                                   **{n: t[b:b + 1] for n, t in keys.items()})
        assert one.output_tokens[0].tolist() == full.output_tokens[b].tolist()


def test_exponential_race_frequencies():
    """argmax w / Exp(1) picks v with probability w_v / sum(w): chi-square over 20,000 keyed draws."""
    w = torch.tensor([0.0, 1.0, 2.0, 3.0, 0.0, 4.0])
    n = 20_000
    idx = exponential_race(w.expand(n, -1), torch.zeros(n, dtype=torch.int64), torch.arange(n),
                           torch.zeros(n, dtype=torch.int64))
    counts = torch.bincount(idx, minlength=6).double()
    assert counts[0] == 0 and counts[4] == 0  # zero weight never wins
    expected = w.double() / w.sum() * n
    support = w > 0
    chi2 = float(((counts[support] - expected[support]) ** 2 / expected[support]).sum())
    df = int(support.sum()) - 1
    assert chi2 < df + 10 * math.sqrt(2 * df)


# ---- the sampling distributions the engine feeds in -------------------------------------------

def _nucleus_oracle(logits, T, top_p, probs=None):
    """Sort-based nucleus of `probs` (default softmax(logits / T)): keep tokens while the mass ranked before
    them < top_p; T = 0 -> one-hot."""
    if T == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    probs = torch.softmax(logits / T, -1) if probs is None else probs
    vals, idx = probs.sort(-1, descending=True)
    keep = (vals.cumsum(-1) - vals) < top_p
    out = torch.zeros_like(probs).scatter(-1, idx, vals * keep)
    return out / out.sum(-1, keepdim=True)


@pytest.mark.parametrize("T", [0.0, 0.7, 1.0])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99, 1.0])
def test_probs_from_logits_matches_sort_oracle(T, top_p):
    from avkit.runtime.sampling import probs_from_logits

    g = torch.Generator().manual_seed(0)
    scale = torch.tensor([8.0, 3.0, 1.0, 0.3, 0.05])[:, None]  # nucleus from ~1 token to > 1024 of 5000
    logits = torch.randn(5, 5000, generator=g) * scale
    got = probs_from_logits(logits, torch.full((5,), T), torch.full((5,), top_p))
    # The softmax is torch's up to float rounding (the CPU backend computes it natively, models/native.py);
    # the cut is the oracle's rule on those very probabilities (near-flat rows put ulps at the boundary).
    full = probs_from_logits(logits, torch.full((5,), T), torch.ones(5))
    torch.testing.assert_close(full, _nucleus_oracle(logits, T, 1.0), atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(got, _nucleus_oracle(logits, T, top_p, full), atol=1e-6, rtol=1e-5)


def test_probs_from_logits_mixed_rows():
    from avkit.runtime.sampling import probs_from_logits

    logits = torch.randn(2, 4, 50, generator=torch.Generator().manual_seed(1))  # [B, S, V]
    T, tp = torch.tensor([[0.0], [0.8]]), torch.tensor([[0.9], [0.9]])  # per request, broadcast over S
    got = probs_from_logits(logits, T, tp)
    for b in range(2):
        torch.testing.assert_close(got[b], _nucleus_oracle(logits[b], float(T[b]), 0.9))


def test_sample_tokens_frequencies():
    from avkit.runtime.sampling import sample_tokens

    probs = torch.tensor([0.1, 0.0, 0.25, 0.4, 0.25])
    n = 20_000
    x = sample_tokens(probs.expand(n, -1), torch.full((n,), 3), torch.arange(n), torch.full((n,), 9))
    counts = torch.bincount(x, minlength=5).double()
    assert counts[1] == 0
    support = probs > 0
    expected = probs.double()[support] * n
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    assert chi2 < 3 + 10 * math.sqrt(6)
