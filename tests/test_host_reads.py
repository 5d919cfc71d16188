"""The speculative step's host reads, counted: one steady-state engine step (tiny models, CPU, the
adaptive policy with the draft gate and the early stop) reads the device exactly where docs/runtime.md
says, and nowhere else. Every call that would wait for a GPU is wrapped and counted
(`Tensor.item/tolist/__bool__/__int__/__float__/cpu/numpy`, `.to("cpu")` and indexing with a boolean
mask, whose size is data-dependent); a new read anywhere in the step fails here."""

import pytest
import torch

from avkit.config import AdaptiveConfig, EngineConfig, EstimatorConfig, SamplingConfig
from avkit.models import load
from avkit.models.testing import write_tiny_model
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.scheduling.adaptive import make_adaptive
from avkit.scheduling.cost import CostTable

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "cpu", "numpy")
K = 4


@pytest.fixture(autouse=True)
def torch_sampling(monkeypatch):
    """The reads counted are those of the torch sampling path, the one a GPU runs (on a CPU the backend's native
    pass, models/native.py, finds the nucleus without any)."""
    monkeypatch.setattr("avkit.models.native.sampling_usable", lambda logits: False)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pair")
    return (load(write_tiny_model(tmp / "t", vocab=300, seed=0, init_std=0.3)),
            load(write_tiny_model(tmp / "d", vocab=300, seed=5, init_std=0.3)))


def _counted_step(engine, monkeypatch) -> dict[str, int]:
    calls: dict[str, int] = {}
    originals = {name: getattr(torch.Tensor, name) for name in (*READS, "to", "__getitem__")}

    def count(name):
        calls[name] = calls.get(name, 0) + 1

    for name in READS:
        original = getattr(torch.Tensor, name)

        def wrapped(self, *a, _name=name, _original=original, **kw):
            count(_name)
            return _original(self, *a, **kw)
        monkeypatch.setattr(torch.Tensor, name, wrapped)
    to, getitem = torch.Tensor.to, torch.Tensor.__getitem__

    def counted_to(self, *a, **kw):
        dest = a[0] if a else kw.get("device")
        if dest == "cpu":  # a read back is written .to("cpu") / .cpu(); .to(device) is the host-to-device copy
            count("to_cpu")
        return to(self, *a, **kw)

    def counted_getitem(self, index):
        if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
            count("mask_index")
        return getitem(self, index)
    monkeypatch.setattr(torch.Tensor, "to", counted_to)
    monkeypatch.setattr(torch.Tensor, "__getitem__", counted_getitem)
    try:
        engine.step()
    finally:
        for name in (*READS, "to", "__getitem__"):
            monkeypatch.setattr(torch.Tensor, name, originals[name])
    return calls


def _engine(pair, *, stop: bool, gate: bool, temperature: float, top_p: float = 1.0):
    cost = CostTable((1, 64), (1.0, 1.0 + 63 * 0.05), (1, 64), (0.05, 0.05))
    policy = make_adaptive(cost=cost, estimator="online_logistic", k=K, config=EstimatorConfig(refit_interval=50),
                           adaptive=AdaptiveConfig(draft_gate=gate), stop_drafting=stop)  # adaptive-stop or adaptive
    engine = Engine(*pair, EngineConfig(k=K, concurrency=4, max_len=64), policy=policy)
    sampling = SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=40, seed=1)
    for i in range(3):
        engine.add_request(Request(f"r{i}", [10 + i, 11, 12 + 3 * i, 7], sampling))
    engine.step()  # admission and prefill (their own reads); the counted step is a steady one
    return engine, policy


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_a_step_reads_the_device_twice(pair, monkeypatch, temperature):
    """No early stop, no gate, top_p = 1: the two documented reads, k_r and the emitted tokens."""
    engine, _ = _engine(pair, stop=False, gate=False, temperature=temperature)
    assert _counted_step(engine, monkeypatch) == {"tolist": 2}


def test_early_stop_and_gate_reads(pair, monkeypatch):
    """+1 per draft pass that may stop early (its [B] mask; K - 1 passes at most), +1 for the gate's rows,
    +1 for the nucleus search when a request has top_p < 1."""
    # The nucleus of a tiny random model can pass the ladder's first rung (64 of 300 tokens), which costs
    # further reads (documented, rare for an LM): a first rung of 299 keeps this count exact.
    monkeypatch.setattr("avkit.runtime.sampling._TOPK_LADDER", (299,))
    engine, _ = _engine(pair, stop=True, gate=True, temperature=1.0, top_p=0.9)
    passes, forwards = [], []
    original, forward = engine.policy.continue_drafting, engine.drafter._forward
    engine.policy.continue_drafting = lambda *a: passes.append(1) or original(*a)
    engine.drafter._forward = lambda *a, **kw: forwards.append(1) or forward(*a, **kw)
    calls = _counted_step(engine, monkeypatch)
    assert 1 <= len(passes) <= K - 1 and len(forwards) >= 1
    # tolist: k_r, the emitted tokens, each early-stop mask; to_cpu + mask_index: the gate's rows (its
    # drafted requests' sizing confidences); __bool__: the nucleus search, per draft pass and the target
    assert calls == {"tolist": 2 + len(passes), "to_cpu": 1, "mask_index": 1, "__bool__": len(forwards) + 1}, calls
