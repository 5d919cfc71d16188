"""Live HybridDrafter: its payoff features equal the offline replay's at every position (no
train/serve skew), and its cache rows are valid deterministic proposals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from avkit.config import HvdReplayConfig, PayoffConfig, SuffixCacheConfig
from avkit.drafters.base import DraftInput
from avkit.hvd.hybrid_drafter import HybridDrafter
from avkit.hvd.payoff_mlp import PayoffMLP
from avkit.hvd.features import ALL_FEATURES
from avkit.hvd.replay import replay, synthetic_generations

K, V = 5, 60
CFG = SuffixCacheConfig(max_depth=10)


def _inp(seqs: list[list[int]], k: int = K) -> DraftInput:
    b = len(seqs)
    return DraftInput(torch.arange(b), seqs, torch.full((b,), k), torch.zeros(b), torch.ones(b),
                      torch.zeros(b, dtype=torch.int64), torch.arange(b), torch.tensor([len(s) for s in seqs]))


def test_live_features_equal_replay():
    gens = synthetic_generations(num_requests=3, seed=6, vocab=V, prompt_len=30, output_len=40, model_rate=1.0)
    classes = np.random.default_rng(0).random((V, 5)) < 0.4
    table = replay(gens, CFG, HvdReplayConfig(k=K), classes)
    payoff = PayoffMLP(ALL_FEATURES, K, PayoffConfig(epochs=1))
    live = HybridDrafter(None, payoff, tau=0.0, cache_config=CFG, classes=classes, vocab_size=V)
    row = 0
    for g in gens:
        for t in range(len(g.output_ids)):
            _, cols = live.features(_inp([g.prompt_ids + g.output_ids[:t]]))
            for name in ALL_FEATURES:
                assert cols[name][0] == pytest.approx(float(table[name][row]), abs=1e-9), (g.request_id, t, name)
            row += 1
        live.release(0)


def test_cache_rows_are_one_hot_proposals():
    live = HybridDrafter(None, None, tau=0.0, cache_config=SuffixCacheConfig(min_token_prob=0.0), vocab_size=V,
                         rule="cache")
    seq = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    prop = live.propose(_inp([seq, [7, 8, 9]]))
    assert prop.kind == ["suffix", "model"]
    n = int(prop.num_drafted[0])
    assert n >= 3 and prop.tokens[0, :3].tolist() == [3, 4, 5]
    assert torch.equal(prop.probs[0, :n].sum(-1), torch.ones(n))
    assert torch.equal(prop.probs[0, torch.arange(n), prop.tokens[0, :n]], torch.ones(n))
    assert int(prop.num_drafted[1]) == 0  # no model drafter and no cache draft: nothing proposed
    assert torch.isfinite(prop.features["q_max"][0, :n]).all()
    assert (prop.extra["match_len"][0, :n] >= 1).all()


def test_a_greedy_batch_gets_the_same_proposal_without_draft_distributions():
    """DraftInput.greedy: the cache rows' one-hot q is not built (width 0); all else is unchanged."""
    import dataclasses

    seqs = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2], [7, 8, 9], [1, 2, 3, 4, 5, 1, 2, 3]]
    props = []
    for greedy in (None, True):
        live = HybridDrafter(None, None, tau=0.0, cache_config=SuffixCacheConfig(min_token_prob=0.0),
                             vocab_size=V, rule="cache")
        props.append(live.propose(dataclasses.replace(_inp(seqs), greedy=greedy)))
    full, lean = props
    assert full.probs.shape == (3, K, V) and lean.probs.shape == (3, K, 0)
    assert int(full.num_drafted[0]) >= 3 and full.probs.sum().item() == full.num_drafted.sum().item()
    for name in ("tokens", "q_sampled", "num_drafted"):
        assert torch.equal(getattr(full, name), getattr(lean, name)), name
    for name in (*full.features, *full.extra):
        a, b = (full.features | full.extra)[name], (lean.features | lean.extra)[name]
        assert torch.equal(a.nan_to_num(-1.0), b.nan_to_num(-1.0)), name


def _greedy_hybrid_equals_target_only(tmp_path, device: str) -> None:
    import dataclasses

    import avkit.models
    from avkit.config import EngineConfig, SamplingConfig
    from avkit.drafters.draft_model import DraftModelDrafter
    from avkit.models.testing import write_tiny_model
    from avkit.runtime.engine import Engine
    from avkit.runtime.request import Request
    from avkit.runtime.trace_rows import MemorySink

    torch.set_num_threads(1)
    target = avkit.models.load(write_tiny_model(tmp_path / "t", vocab=300, seed=0, init_std=0.3), device=device)
    target = dataclasses.replace(target, tokenizer=type("T", (), {"eos_token_ids": set()})())
    draft = avkit.models.load(write_tiny_model(tmp_path / "d", vocab=300, seed=1, init_std=0.3), device=device)
    # repetitive prompts: the suffix cache has drafts from the first step on
    reqs = [Request(f"r{i}", [5 + i, 6, 7, 8, 9] * 4, SamplingConfig(temperature=0.0, max_new_tokens=20))
            for i in range(3)]
    cfg = EngineConfig(k=4, concurrency=2, max_len=96)
    ref = Engine(target, None, EngineConfig(k=0, concurrency=2, max_len=96)).generate(reqs)
    hybrid = HybridDrafter(DraftModelDrafter(draft, cfg.concurrency, cfg.max_len), None, tau=0.0, k=4,
                           rule="cache")
    sink = MemorySink()
    out = Engine(target, None, cfg, sink=sink, drafter=hybrid).generate(reqs)
    for a, b in zip(ref, out):
        assert b.output_ids == a.output_ids, a.request_id
    kinds = set(np.asarray(sink.columns()["drafter"]).tolist())
    assert kinds == {"suffix", "model"}  # both drafters ran, so the model cache caught up after cache steps


def test_engine_greedy_with_hybrid_equals_target_only(tmp_path):
    _greedy_hybrid_equals_target_only(tmp_path, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_engine_greedy_with_hybrid_on_cuda_equals_target_only(tmp_path):
    """The same run with both models on the GPU: the drafter's tensors follow the inputs' device
    (test_every_tensor_follows_the_input_device checks the calls on CPU), its tries stay on the host."""
    _greedy_hybrid_equals_target_only(tmp_path, "cuda")


def test_from_file_loads_payoff_and_tau(tmp_path):
    names = ("match_len", "draft_len", "score")
    x = np.random.default_rng(0).random((64, 3)).astype(np.float32)
    PayoffMLP(names, K, PayoffConfig(epochs=1)).fit(x, x[:, 1]).save(tmp_path / "p.pt", tau=2.5)
    live = HybridDrafter.from_file(None, tmp_path / "p.pt", vocab_size=V)
    assert live.tau == 2.5 and live.k == K and live.payoff.feature_names == names


def test_copy_features_equal_brute_force():
    """in_prompt / in_output (the matched context + the draft occur in the prompt / the output so far) vs a
    direct search, on growing texts over small and large alphabets."""
    from avkit.hvd.features import RequestFeatures
    from avkit.hvd.suffix_cache import CacheDraft

    rng = np.random.default_rng(3)
    for alphabet in (2, 3, 50):
        prompt = rng.integers(0, alphabet, 60).tolist()
        f = RequestFeatures(prompt, K, 16, None)
        for _ in range(150):
            m, draft = int(rng.integers(0, 4)), rng.integers(0, alphabet, int(rng.integers(1, 6))).tolist()
            row = f.row(CacheDraft(draft, [1.0] * len(draft), m, float(len(draft)), "local"))
            pat = f.seq[len(f.seq) - m:] + draft
            found = [any(text[i: i + len(pat)] == pat for i in range(len(text) - len(pat) + 1))
                     for text in (prompt, f.seq[len(prompt):])]  # brute force
            assert [row["in_prompt"], row["in_output"]] == found, (alphabet, len(f.seq), pat)
            f.append(int(rng.integers(0, alphabet)), draft)


class _DeviceLog(torch.overrides.TorchFunctionMode):
    """Records the device asked for by every tensor factory call (None when the call named none)."""

    FACTORIES = frozenset({torch.zeros, torch.ones, torch.full, torch.empty, torch.tensor, torch.as_tensor,
                           torch.arange, torch.zeros_like, torch.full_like, torch.from_numpy})

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, object]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.FACTORIES and not func.__name__.endswith("_like"):
            self.calls.append((func.__name__, kwargs.get("device")))
        return func(*args, **kwargs)


def test_every_tensor_follows_the_input_device():
    """Each tensor the hybrid drafter makes names the device of its inputs (on CUDA a CPU tensor
    would fail at the first mixed op); here the inputs sit on the CPU, so `device` must be given."""
    live = HybridDrafter(None, None, tau=0.0, cache_config=SuffixCacheConfig(min_token_prob=0.0), vocab_size=V,
                         rule="cache")
    seq = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    inp = _inp([seq, [7, 8, 9], seq[:9]])
    with _DeviceLog() as log:
        prop = live.propose(inp)
    assert log.calls and all(str(dev) == str(inp.num_draft.device) for _, dev in log.calls), log.calls
    assert prop.kind == ["suffix", "model", "suffix"]
    for t in (prop.tokens, prop.probs, prop.q_sampled, prop.num_drafted, *prop.features.values(),
              *prop.extra.values()):
        assert t.device == inp.num_draft.device

