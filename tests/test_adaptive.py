"""The adaptive verify policy (avkit/scheduling/adaptive.py): decisions, labels, refits, losslessness."""

import json
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from avkit.errors import ConfigError
from avkit.estimators.base import ESTIMATORS
from avkit.scheduling.adaptive import AdaptiveVerification, make_adaptive, observed_labels
from avkit.scheduling.cost import CostTable
from avkit.scheduling.spec import POLICIES
from avkit.step_types import DraftBatch, Load, VerifyOutcome


@dataclass
class Logistic:
    """sigma(slope * f + intercept_i); records every update; 'refits' every `every` calls."""

    slope: float = 1.0
    intercept: float = 0.0
    every: int = 2
    name: str = "test-logistic"
    lossless: bool = True
    feature: str = "logit_qmax"
    updates: list = field(default_factory=list)
    k: int = 7

    def predict(self, features, positions):
        return 1.0 / (1.0 + np.exp(-(self.slope * features + self.intercept - 0.0 * positions)))

    def update(self, features, positions, predictions, labels):
        self.updates.append((features, positions, predictions, labels))
        return len(self.updates) % self.every == 0

    def state_dict(self):
        return {"slope": self.slope, "intercepts": [self.intercept], "n": len(self.updates)}


def _cost(verify_slope: float, fixed: float = 1.0) -> CostTable:
    return CostTable((1, 1000), (1.0, 1.0 + 999 * verify_slope), (1, 1000), (fixed, fixed))


def _batch(logits, drafted):
    f = torch.tensor(logits, dtype=torch.float32)
    return DraftBatch({"logit_qmax": f, "q_max": torch.sigmoid(f)}, torch.tensor(drafted))


def test_confident_and_flat_cost_verifies_all():
    policy = AdaptiveVerification(_cost(0.0), Logistic(slope=1.0, intercept=40.0))
    plan = policy.num_verify(_batch([[5.0] * 4] * 3, [4, 2, 0]), Load(3, 3, 3))
    assert plan.num_verify.tolist() == [4, 2, 0]
    assert plan.confidences.shape == (3, 4)


def test_steep_cost_verifies_nothing():
    policy = AdaptiveVerification(_cost(100.0), Logistic())
    assert policy.num_verify(_batch([[2.0] * 4] * 3, [4, 4, 4]), Load(3, 3, 3)).num_verify.tolist() == [0, 0, 0]


def test_doubtful_request_is_cut_first():
    policy = AdaptiveVerification(_cost(0.02), Logistic())
    nv = policy.num_verify(_batch([[6.0] * 7, [-1.0] * 7], [7, 7]), Load(2, 2, 2)).num_verify
    assert nv[0] > nv[1]


def test_observed_labels_follow_design():
    # request 0: verified 3, accepted 1 -> slots 0,1 observed (1 accepted, 1 rejected), slot 2 censored
    # request 1: verified 2 (trimmed from 4), accepted 2 -> slots 0,1 observed, slots 2,3 censored
    # request 2: verified 0 -> nothing observed
    obs, lab = observed_labels(torch.tensor([3, 2, 0]), torch.tensor([1, 2, 0]), 4)
    assert obs.tolist() == [[True, True, False, False], [True, True, False, False], [False] * 4]
    assert lab[obs].tolist() == [True, False, True, True]


def test_observe_feeds_only_observed_slots_and_logs_refits():
    est = Logistic(every=2)
    policy = AdaptiveVerification(_cost(0.0), est)
    batch = _batch([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [3, 3])
    for _ in range(4):
        plan = policy.num_verify(batch, Load(2, 2, 2))
        policy.observe(VerifyOutcome(batch.features, plan.confidences, plan.num_verify, torch.tensor([1, 3])))
    f, pos, pred, lab = est.updates[0]
    np.testing.assert_array_equal(f, [1.0, 2.0, 4.0, 5.0, 6.0])
    np.testing.assert_array_equal(pos, [0, 1, 0, 1, 2])
    np.testing.assert_array_equal(lab, [1, 0, 1, 1, 1])
    np.testing.assert_allclose(pred, est.predict(f, pos), rtol=1e-6)  # the predictions made when drafting
    assert [t["refit"] for t in policy.trajectory] == [1, 2] and policy.trajectory[-1]["step"] == 4


def test_estimator_none_is_full_verification(monkeypatch):
    policy = make_adaptive(cost=_cost(100.0), estimator="none")
    plan = policy.num_verify(_batch([[0.0] * 3], [2]), Load(1, 1, 1))
    assert plan.num_verify.tolist() == [2] and plan.confidences is None


def test_registry_and_errors(monkeypatch, tmp_path):
    monkeypatch.setitem(ESTIMATORS._entries, "test-logistic", lambda **kw: Logistic(**kw))
    policy = POLICIES.make("adaptive", cost="roofline:H200:8b", estimator="test-logistic", slope=2.0)
    assert isinstance(policy, AdaptiveVerification) and policy.estimator.slope == 2.0
    with pytest.raises(ConfigError, match="unknown estimator nope; choose from "):
        POLICIES.make("adaptive", cost=_cost(0.0), estimator="nope")
    with pytest.raises(ConfigError, match="coefficients: no such file"):
        POLICIES.make("adaptive", cost=_cost(0.0), estimator="test-logistic", coefficients=tmp_path / "x.json")
    bad = AdaptiveVerification(_cost(0.0), Logistic(feature="head_conf"))
    with pytest.raises(ConfigError, match="needs feature 'head_conf'"):
        bad.num_verify(_batch([[0.0]], [1]), Load(1, 1, 1))


# ---- through the whole engine ----------------------------------------------------------------

def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson chi2, bins with expected count < 5 pooled into one (joined to the smallest if still < 5)."""
    exp = probs.double() * float(counts.sum())
    big = exp >= 5
    obs_l, exp_l = counts.double()[big].tolist(), exp[big].tolist()
    pool_o, pool_e = float(counts.double()[~big].sum()), float(exp[~big].sum())
    if pool_e >= 5:
        obs_l.append(pool_o)
        exp_l.append(pool_e)
    elif pool_e > 0:
        i = int(np.argmin(exp_l))
        obs_l[i] += pool_o
        exp_l[i] += pool_e
    return sum((o - e) ** 2 / e for o, e in zip(obs_l, exp_l)), len(exp_l) - 1


def test_engine_with_adaptive_verification_is_lossless(tmp_path):
    """First two tokens after a fixed prompt over 3,000 seeded requests, adaptive policy trimming live
    (online estimator refitting every 5 steps) and its draft gate switching speculation off and on,
    vs HF transformers' own distribution of the target.
    Pass: chi2 < df + 10 sqrt(2 df) (the engine tests' criterion)."""
    import transformers

    from avkit.config import AdaptiveConfig, EngineConfig, EstimatorConfig, SamplingConfig
    from avkit.models import load
    from avkit.models.testing import write_tiny_model
    from avkit.runtime.engine import Engine
    from avkit.runtime.request import Request

    torch.set_num_threads(1)
    target_dir = write_tiny_model(tmp_path / "t", vocab=300, seed=0, init_std=0.3)
    target, draft = load(target_dir), load(write_tiny_model(tmp_path / "d", vocab=300, seed=5, init_std=0.3))
    target = type(target)(target.model, type("T", (), {"eos_token_ids": set()})(), "t", "")
    cost = CostTable((1, 400), (1.0, 5.0), (1, 400), (0.5, 0.5),  # sure drafts would pay; doubtful ones trimmed
                     prefill_tokens=(1, 400), prefill_ms=(0.0, 0.0))  # catch-ups free: the gate switches often
    policy = make_adaptive(cost=cost, estimator="online_logistic", k=3, config=EstimatorConfig(refit_interval=5),
                           adaptive=AdaptiveConfig(probe_every=2))  # the gate skips most steps, probes often
    verified, drafted = [], []
    observe = policy.observe
    policy.observe = lambda o: (verified.append(int(o.num_verify.sum())), observe(o))
    prompt, n = [40, 41, 42, 43, 44], 3000
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=3, seed=7)
    engine = Engine(target, draft, EngineConfig(k=3, concurrency=100, max_len=16), policy=policy)
    num_verify = policy.num_verify
    policy.num_verify = lambda b, l: (drafted.append(int(b.num_drafted.sum())), num_verify(b, l))[1]
    gens = engine.generate([Request(f"s{i}", prompt, sampling) for i in range(n)])
    out = torch.tensor([g.output_ids[:2] for g in gens])  # [N, 2]
    share = sum(verified) / sum(drafted)
    assert 0.05 < share < 0.95, f"adaptive should trim some drafts and keep others, verified {share:.2f}"
    assert policy.refits >= 1
    assert 0.2 < policy.gate.skipped_total / policy.gate.steps < 0.8, "the gate should skip some steps, not all"

    hf = transformers.AutoModelForCausalLM.from_pretrained(target_dir).eval()
    with torch.no_grad():
        p0 = hf(torch.tensor([prompt])).logits[0, -1].softmax(-1)  # [V]
        ctx = torch.cat([torch.tensor(prompt).expand(p0.numel(), -1), torch.arange(p0.numel())[:, None]], 1)
        p1 = p0 @ hf(ctx).logits[:, -1].softmax(-1)  # [V] marginal of the second token
    for what, counts, probs in (("token 0", torch.bincount(out[:, 0], minlength=300), p0),
                                ("token 1", torch.bincount(out[:, 1], minlength=300), p1)):
        chi2, df = _chi2(counts, probs)
        assert chi2 < df + 10 * np.sqrt(2 * df), f"{what}: chi2 {chi2:.1f}, df {df}"


def test_warm_start_from_coefficients(tmp_path):
    from avkit.config import EstimatorConfig

    path = tmp_path / "coefficients.json"
    path.write_text(json.dumps({"schema_version": 1, "feature": "logit_qmax", "num_positions": 3, "slope": 0.9,
                                "intercepts": [1.0, 0.5, 0.0], "observations": [10, 5, 1]}))
    policy = make_adaptive(cost=_cost(0.0), estimator="online_logistic", coefficients=path, k=3,
                           config=EstimatorConfig(refit_interval=7))
    assert policy.estimator.slope == 0.9 and policy.estimator.intercepts.tolist() == [1.0, 0.5, 0.0]
    with pytest.raises(ConfigError, match="field .num_positions. does not match the K being served"):
        make_adaptive(cost=_cost(0.0), estimator="online_logistic", coefficients=path, k=5)
    path.write_text("{broken")
    with pytest.raises(ConfigError, match="coefficients.json"):
        make_adaptive(cost=_cost(0.0), estimator="online_logistic", coefficients=path, k=3)


def test_lossy_estimators_are_refused_live():
    from avkit.config import EstimatorConfig

    with pytest.raises(ConfigError, match="lossless estimator"):
        make_adaptive(cost=_cost(0.0), estimator="online_logistic", k=3,
                      config=EstimatorConfig(feature="logit_q_sampled"))


@pytest.mark.parametrize("seed", range(6))
def test_decisions_are_causal_within_a_request(seed):
    """The losslessness condition itself: whether slot j of request r is verified may depend on r's
    features at positions <= j (fixed before x_j is drawn) but not on those after j (functions of x_j).
    Perturbing request r's features past j must leave min(num_verify[r], j + 1) unchanged."""
    g = torch.Generator().manual_seed(seed)
    # Step-shaped verify cost (tiles of 8 tokens): with a linear cost the live rule happens to be causal.
    tiles = CostTable((1, 8, 9, 16, 17, 24, 25, 32, 33, 56), (1.0, 1.0, 1.6, 1.6, 2.2, 2.2, 2.8, 2.8, 3.4, 4.0),
                      (1, 1000), (1.0, 1.0))
    policy = AdaptiveVerification(tiles, Logistic(slope=0.8, intercept=0.5))
    b, k = 6, 7
    feats = torch.randn(b, k, generator=g) * 3  # [B, K]
    drafted = torch.full((b,), k)
    base = policy.num_verify(_batch(feats.tolist(), drafted.tolist()), Load(b, b, b)).num_verify
    assert 0 < int(base.sum()) < b * k  # the budget really trims: the test can see a dependence
    changed = 0
    for r in range(b):
        for j in range(k - 1):
            other = feats.clone()
            other[r, j + 1:] = torch.randn(k - j - 1, generator=g) * 6  # what x_j would change
            nv = policy.num_verify(_batch(other.tolist(), drafted.tolist()), Load(b, b, b)).num_verify
            assert min(int(nv[r]), j + 1) == min(int(base[r]), j + 1), (r, j)
            changed += int(nv[r] != base[r])
    assert changed > 0  # deeper slots do move with their own features


def test_live_budget_sizing_would_be_lossy():
    """Counter-check: sizing b* from the live survivals (no `sizing`) lets a request's deeper features
    move whether its first slot is verified, the look-ahead that biases the output."""
    from avkit.scheduling.plan import plan, single_group, verify_lookup

    # A step-shaped verify cost (as GPUs have: tiles fill up): 2..4 target tokens cost the same.
    cost = CostTable((1, 2, 4, 5), (1.0, 2.0, 2.0, 10.0), (1, 1000), (1.0, 1.0))

    def first_slot_verified(c1):
        conf = torch.tensor([[0.4, c1, c1]])  # [1, 3]; c[0, 1:] would depend on the drawn x_0
        one = torch.tensor([1])
        p = plan(conf, torch.tensor([3]), single_group(1), 1, num_sampling=one, num_scheduled=one,
                 fixed_ms=torch.tensor([1.0], dtype=torch.float64), verify_ms=verify_lookup(cost.verify_cost, 8))
        return int(p.num_verify[0]) >= 1

    assert first_slot_verified(0.99) != first_slot_verified(0.01)


def test_engine_stops_drafting_early_and_stays_exact_under_greedy(tmp_path):
    """The drafter asks the policy's `continue_drafting` after each pass: some requests stop before K,
    and greedy output still equals target-only greedy decoding token for token."""
    from avkit.config import EngineConfig, SamplingConfig
    from avkit.models import load
    from avkit.models.testing import write_tiny_model
    from avkit.runtime.engine import Engine
    from avkit.runtime.request import Request

    torch.set_num_threads(1)
    target = load(write_tiny_model(tmp_path / "t", vocab=300, seed=0, init_std=0.3))
    draft = load(write_tiny_model(tmp_path / "d", vocab=300, seed=5, init_std=0.3))
    target = type(target)(target.model, type("T", (), {"eos_token_ids": set()})(), "t", "")
    from avkit.config import AdaptiveConfig

    cost = CostTable((1, 400), (1.0, 1.0 + 399 * 0.03), (1, 400), (3.0, 3.0))
    # the early stop alone: at this cost the draft gate would not draft at all (tests/test_gate.py)
    policy = make_adaptive(cost=cost, estimator="online_logistic", k=5, adaptive=AdaptiveConfig(draft_gate=False),
                           stop_drafting=True)
    drafted = []
    num_verify = policy.num_verify
    policy.num_verify = lambda b, l: (drafted.append(b.num_drafted.clone()), num_verify(b, l))[1]
    greedy = SamplingConfig(temperature=0.0, top_p=1.0, max_new_tokens=24)
    reqs = [Request(f"g{i}", [10 + i, 11, 12 + 2 * i], greedy) for i in range(6)]
    spec = Engine(target, draft, EngineConfig(k=5, concurrency=6, max_len=40), policy=policy).generate(reqs)
    plain = Engine(target, None, EngineConfig(k=0, concurrency=6, max_len=40)).generate(reqs)
    assert [g.output_ids for g in spec] == [g.output_ids for g in plain]
    early = torch.cat(drafted[:3])  # the first steps: every request still has > K tokens to go
    assert bool((early < 5).any()), "no request stopped drafting early"
