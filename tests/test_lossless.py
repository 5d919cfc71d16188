"""Losslessness: emitted tokens follow the target distribution (chi-square, fixed seeds).

Criterion (issue 3): merge bins with expected count < 5, pass if chi2 < df + 10 * sqrt(2 df).
The counter-example shows the same test rejects a lossy rule (trimming on q(x_sampled)).
"""

from __future__ import annotations

import math

import pytest
import torch

import avkit.models
from avkit.config import EngineConfig, SamplingConfig
from avkit.models.testing import write_tiny_model
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.runtime.sampling import sample_tokens
from avkit.scheduling.policy import VerifyPolicy
from avkit.step_types import DraftBatch, Load, StepPlan
from avkit.kernels.rejection_ref import rejection_sample_ref

torch.set_num_threads(1)


def chi2_statistic(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson chi2 of observed ``counts`` [V] against ``probs`` [V], bins with expected < 5 merged.

    Small bins are pooled (smallest first) until the pool reaches 5; a pool still short at the end
    joins the smallest remaining bin. Returns (chi2, degrees of freedom).
    """
    n = float(counts.sum())
    expected = probs.double() * n
    order = torch.argsort(expected)
    obs, exp = counts.double()[order], expected[order]
    big = exp >= 5
    pool_o, pool_e = float(obs[~big].sum()), float(exp[~big].sum())
    obs, exp = obs[big].tolist(), exp[big].tolist()
    if pool_e > 0:
        if pool_e < 5 and exp:
            obs[0] += pool_o
            exp[0] += pool_e
        else:
            obs.append(pool_o)
            exp.append(pool_e)
    chi2 = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    return chi2, len(exp) - 1


def assert_fits(counts, probs, what):
    chi2, df = chi2_statistic(counts, probs)
    assert df >= 1, what
    bound = df + 10 * math.sqrt(2 * df)
    assert chi2 < bound, f"{what}: chi2 {chi2:.1f} >= {bound:.1f} (df {df})"


# ---- direct distributions: a context-free target and draft ---------------------------------
# p_j and q_j do not depend on earlier tokens, so the token emitted at slot j, given the step
# reaches slot j, must follow p_j exactly.

def _direct_case(K, T, V=12, families=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(K + 1, V, generator=g) * 1.5 / T, -1)  # [K+1, V]
    q = torch.softmax(torch.randn(families, K, V, generator=g) * 1.5 / T, -1)  # [F, K, V]
    return p, q


def _draw_drafts(q_rows, seeds, keys, positions):
    """Draft tokens [N, K] drawn from q_rows [N, K, V] with the engine's keyed sampler."""
    K = q_rows.shape[1]
    return torch.stack([sample_tokens(q_rows[:, j], seeds, keys, positions + j) for j in range(K)], 1)


def _qmax_policy(q_rows):
    """num_verify = leading positions with q_max >= 0.3: a function of q's shape only (lossless)."""
    confident = q_rows.amax(-1) >= 0.3  # [N, K]
    return confident.long().cumprod(-1).sum(-1)


@pytest.mark.parametrize("policy", ["full", "qmax"])
@pytest.mark.parametrize("T", [0.6, 1.0])
@pytest.mark.parametrize("K", [1, 3, 5])
def test_direct_distributions_are_lossless(K, T, policy):
    N = 20_000
    p, q = _direct_case(K, T, seed=K * 10 + int(T * 10))
    fam = torch.arange(N) % q.shape[0]
    q_rows = q[fam]  # [N, K, V]
    seeds, keys, pos = torch.full((N,), 7), torch.arange(N), torch.full((N,), 100)
    x = _draw_drafts(q_rows, seeds, keys, pos)
    k = torch.full((N,), K) if policy == "full" else _qmax_policy(q_rows)
    res = rejection_sample_ref(p.expand(N, -1, -1), q_rows, x, k, greedy=False, seeds=seeds,
                               request_keys=keys, positions=pos)
    for j in range(K + 1):
        reached = res.num_accepted >= j  # slot j emitted a token
        if int(reached.sum()) < 500:
            continue
        counts = torch.bincount(res.output_tokens[reached, j], minlength=p.shape[1])
        assert_fits(counts, p[j], f"slot {j}")


def test_trimming_on_q_sampled_is_lossy():
    """Seeds' counter-example: p = [.5, .5], q = [.2, .8], verify only if q(x) >= 0.5 -> [.4, .6]."""
    N = 40_000
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]]).expand(N, -1, -1)
    q = torch.tensor([[0.2, 0.8]]).expand(N, -1, -1)
    seeds, keys, pos = torch.zeros(N, dtype=torch.int64), torch.arange(N), torch.zeros(N, dtype=torch.int64)
    x = _draw_drafts(q, seeds, keys, pos)
    q_x = q[:, 0].gather(-1, x)[:, 0]
    k = (q_x >= 0.5).long()  # LOSSY: depends on the drawn token
    res = rejection_sample_ref(p, q, x, k, greedy=False, seeds=seeds, request_keys=keys, positions=pos)
    share_a = float((res.output_tokens[:, 0] == 0).double().mean())
    sigma = math.sqrt(0.4 * 0.6 / N)
    assert abs(share_a - 0.4) < 3 * sigma, share_a
    counts = torch.bincount(res.output_tokens[:, 0], minlength=2)
    chi2, df = chi2_statistic(counts, torch.tensor([0.5, 0.5]))
    assert chi2 > df + 10 * math.sqrt(2 * df)  # the test sees the bias
    # The same trimming decided from q's shape (q_max) instead keeps [.5, .5].
    k_lossless = (q[:, 0].amax(-1) >= 0.5).long()
    res = rejection_sample_ref(p, q, x, k_lossless, greedy=False, seeds=seeds, request_keys=keys, positions=pos)
    assert_fits(torch.bincount(res.output_tokens[:, 0], minlength=2), torch.tensor([0.5, 0.5]), "q_max trim")


def test_looking_ahead_is_lossy():
    """Verifying slot 0 only when q_1 is confident is lossy when q_1's shape depends on the drawn x_0.

    q_1(. | x_0) is peaky after x_0 = b and flat after a, so "verify if q_max(q_1) >= 0.6" is the
    counter-example's trimming in disguise: slot 0 emits [.4, .6] instead of p_0 = [.5, .5].
    """
    N = 40_000
    p = torch.full((N, 3, 2), 0.5)
    q = torch.tensor([[0.2, 0.8], [0.5, 0.5]]).repeat(N, 1, 1)  # [N, 2, V]; q_1 filled in below
    seeds, keys, pos = torch.zeros(N, dtype=torch.int64), torch.arange(N), torch.zeros(N, dtype=torch.int64)
    x0 = sample_tokens(q[:, 0], seeds, keys, pos)
    q[x0 == 1, 1] = torch.tensor([0.9, 0.1])  # the draft's next distribution depends on what it drew
    x = torch.stack([x0, sample_tokens(q[:, 1], seeds, keys, pos + 1)], 1)
    k = torch.where(q[:, 1].amax(-1) >= 0.6, 2, 0)  # looks ahead at q_1: LOSSY
    res = rejection_sample_ref(p, q, x, k, greedy=False, seeds=seeds, request_keys=keys, positions=pos)
    share_a = float((res.output_tokens[:, 0] == 0).double().mean())
    assert abs(share_a - 0.4) < 3 * math.sqrt(0.4 * 0.6 / N), share_a
    # Causal: slot 0 decided from q_0, slot 1 from q_1 (x_0 is then already in the output) -> lossless.
    k = (q[:, 0].amax(-1) >= 0.6).long() + (q[:, 1].amax(-1) >= 0.6).long() * (q[:, 0].amax(-1) >= 0.6).long()
    res = rejection_sample_ref(p, q, x, k, greedy=False, seeds=seeds, request_keys=keys, positions=pos)
    assert_fits(torch.bincount(res.output_tokens[:, 0], minlength=2), torch.tensor([0.5, 0.5]), "causal rule")
    reached = res.num_accepted >= 1
    assert_fits(torch.bincount(res.output_tokens[reached, 1], minlength=2), torch.tensor([0.5, 0.5]), "slot 1")


# ---- through the whole engine ----------------------------------------------------------------

class _QmaxPolicy(VerifyPolicy):
    """Verify the leading drafts whose q_max >= 0.4 (lossless: a feature of q's shape)."""

    name = "qmax-test"

    def num_verify(self, batch: DraftBatch, load: Load) -> StepPlan:
        confident = torch.nan_to_num(batch.features["q_max"], nan=0.0) >= 0.4
        return StepPlan(confident.long().cumprod(-1).sum(-1).clamp(max=batch.num_drafted))


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Independent nucleus oracle by a full sort: keep tokens while the mass before them < top_p."""
    vals, idx = probs.sort(-1, descending=True)
    keep = (vals.cumsum(-1) - vals) < top_p
    out = torch.zeros_like(probs).scatter(-1, idx, vals * keep)
    return out / out.sum(-1, keepdim=True)


def assert_first_two_tokens_follow_hf(target_dir, prompt: list[int], top_p: float, outputs) -> None:
    """Chi-square of the first two sampled tokens of many requests (`outputs` [N, >= 2] ids at T = 1,
    nucleus top_p) against HF transformers' distribution of the target at `target_dir`: token 0, and
    token 1's marginal over token 0."""
    import transformers

    out = torch.as_tensor(outputs)[:, :2]  # [N, 2]
    hf = transformers.AutoModelForCausalLM.from_pretrained(target_dir).eval()
    with torch.no_grad():
        p0 = _top_p(hf(torch.tensor([prompt])).logits[0, -1].softmax(-1), top_p)  # [V]
        support = p0.nonzero().squeeze(-1)
        ctx = torch.cat([torch.tensor(prompt).expand(len(support), -1), support[:, None]], 1)
        p1 = _top_p(hf(ctx).logits[:, -1].softmax(-1), top_p)  # [n, V]
    v = p0.shape[0]
    assert_fits(torch.bincount(out[:, 0], minlength=v), p0, "token 0")
    assert_fits(torch.bincount(out[:, 1], minlength=v), p0[support] @ p1, "token 1 (marginal)")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("lossless_models")
    target_dir = write_tiny_model(root / "t", vocab=300, seed=0, init_std=0.3)
    draft_dir = write_tiny_model(root / "d", vocab=300, seed=5, init_std=0.3)
    return target_dir, avkit.models.load(target_dir), avkit.models.load(draft_dir)


def _top_k_min_p(probs: torch.Tensor, top_k: int, min_p: float) -> torch.Tensor:
    """Independent top-k / min-p oracle by a full sort: keep the first k sorted values (and ties with the
    k-th) and those >= min_p * max, renormalise."""
    vals, _ = probs.sort(-1, descending=True)
    kth = vals[..., top_k - 1:top_k] if top_k > 0 else torch.zeros_like(vals[..., :1])
    keep = (probs >= kth) & (probs >= min_p * vals[..., :1])
    out = probs * keep
    return out / out.sum(-1, keepdim=True)


@pytest.mark.parametrize("policy, top_k, min_p", [("full", 0, 0.0), ("qmax", 0, 0.0), ("full", 6, 0.0),
                                                  ("qmax", 0, 0.2), ("qmax", 8, 0.05)])
def test_engine_is_lossless(pair, policy, top_k, min_p):
    """First two tokens after a fixed prompt over 2,000 seeded requests vs the target's own distribution,
    with the request's top-k / min-p applied by the verifier (the draft proposes from its untruncated q).

    The oracle is HF transformers on the same checkpoint, with sort-based top-k, min-p and top-p.
    """
    import transformers

    target_dir, target, draft = pair
    target = type(target)(target.model, type("T", (), {"eos_token_ids": set()})(), "t", "")
    prompt, top_p, N = [40, 41, 42, 43, 44], 0.9, 2000
    sampling = SamplingConfig(temperature=1.0, top_p=top_p, max_new_tokens=4, seed=123, top_k=top_k, min_p=min_p)
    pol = _QmaxPolicy() if policy == "qmax" else None
    engine = Engine(target, draft, EngineConfig(k=3, concurrency=100, max_len=16), policy=pol)
    gens = engine.generate([Request(f"s{i}", prompt, sampling) for i in range(N)])
    out = torch.tensor([g.output_ids[:2] for g in gens])  # [N, 2]

    hf = transformers.AutoModelForCausalLM.from_pretrained(target_dir).eval()
    with torch.no_grad():
        p0 = _top_p(_top_k_min_p(hf(torch.tensor([prompt])).logits[0, -1].softmax(-1), top_k, min_p), top_p)  # [V]
        support = p0.nonzero().squeeze(-1)  # next tokens with mass
        ctx = torch.cat([torch.tensor(prompt).expand(len(support), -1), support[:, None]], 1)
        p1 = _top_p(_top_k_min_p(hf(ctx).logits[:, -1].softmax(-1), top_k, min_p), top_p)  # [n, V]: p(. | prompt, x0)
    V = p0.shape[0]
    assert_fits(torch.bincount(out[:, 0], minlength=V), p0, "token 0")
    assert_fits(torch.bincount(out[:, 1], minlength=V), p0[support] @ p1, "token 1 (marginal)")
