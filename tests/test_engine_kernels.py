"""`EngineConfig(kernels="triton")` on a CPU (Triton's interpreter): the engine's hot path runs every Triton
kernel (counted per call: confidence in each draft pass, allocation for the plan, rejection sampling,
IRLS statistics for the online refit, with refit rounds inside the run) and its outputs equal the torch
path's: the same tokens and the same integer/boolean trace columns bit for bit, with an adaptive policy
that trims (so the allocation kernel's prefixes matter). The float columns the confidence kernel computes
(features, confidences) agree to 1e-5: the kernel sums the softmax online, in another order than torch."""

import numpy as np
import pytest
import torch

from avkit.config import AdaptiveConfig, EngineConfig, EstimatorConfig, SamplingConfig
from avkit.kernels.dispatch import Kernels, select_kernels
from avkit.models import load
from avkit.models.testing import write_tiny_model
from avkit.runtime.engine import Engine
from avkit.runtime.request import Request
from avkit.runtime.trace_rows import MemorySink
from avkit.scheduling.adaptive import make_adaptive
from avkit.scheduling.cost import CostTable

HOT_PATH = ("confidence", "allocate", "rejection_sample", "irls_stats")  # every kernel, every drafting step
KERNEL_FLOATS = ("logit_qmax", "q_max", "q_2nd", "entropy", "log_margin", "neg_log_neg_log_qmax", "confidence")


def _counting(kernels: Kernels, calls: dict) -> Kernels:
    def wrap(name, fn):
        def counted(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return fn(*args, **kwargs)
        return counted
    return Kernels(kernels.backend, *(wrap(n, getattr(kernels, n)) for n in
                                      ("confidence", "rejection_sample", "irls_stats", "allocate")))


def _run(pair, backend: str, monkeypatch, temperature: float):
    calls: dict = {}
    monkeypatch.setattr("avkit.runtime.engine.select_kernels",
                        lambda device, name: _counting(select_kernels(device, name), calls))
    cost = CostTable((1, 64), (1.0, 1.0 + 63 * 0.05), (1, 64), (0.2, 0.2))  # verifying costs: some drafts trimmed
    policy = make_adaptive(cost=cost, estimator="online_logistic", k=4, config=EstimatorConfig(refit_interval=3),
                           adaptive=AdaptiveConfig(draft_gate=False), stop_drafting=True)
    sink = MemorySink()
    engine = Engine(*pair, EngineConfig(k=4, concurrency=4, max_len=48, kernels=backend), policy=policy, sink=sink)
    sampling = SamplingConfig(temperature=temperature, top_p=0.9, max_new_tokens=12, seed=3)
    reqs = [Request(f"r{i}", [10 + i, 11, 12 + 3 * i, 7], sampling) for i in range(6)]
    gens = engine.generate(reqs)
    assert policy.refits >= 2  # online refit rounds ran inside the run (from the kernel's statistics)
    coef = [policy.estimator.slope, *policy.estimator.intercepts]
    return [g.output_ids for g in gens], sink.columns(), calls, engine.kernels.backend, coef


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pair")
    target = load(write_tiny_model(tmp / "t", vocab=300, seed=0, init_std=0.3))
    draft = load(write_tiny_model(tmp / "d", vocab=300, seed=5, init_std=0.3))
    return target, draft


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_triton_hot_path_equals_the_torch_path(kernels, pair, monkeypatch, temperature):
    torch.set_num_threads(1)
    out_t, rows_t, calls_t, name_t, coef_t = _run(pair, "torch", monkeypatch, temperature)
    out_k, rows_k, calls_k, name_k, coef_k = _run(pair, "triton", monkeypatch, temperature)
    assert (name_t, name_k) == ("torch", "triton")
    steps = len(set(rows_t["engine_step"].tolist()))
    for calls in (calls_t, calls_k):  # every step with drafts drafts, plans, verifies and learns through the set
        assert all(calls.get(n, 0) >= steps for n in HOT_PATH), calls
    np.testing.assert_allclose(coef_k, coef_t, rtol=0, atol=1e-5)  # the refits agree
    verified = np.asarray(rows_t["verified"], dtype=bool)
    assert 0 < verified.sum() < verified.size  # the policy trimmed: the allocation decided something
    assert out_k == out_t
    assert rows_k.keys() == rows_t.keys()
    for col, want in rows_t.items():
        got = rows_k[col]
        if col == "step_time_ms":
            continue  # wall time
        if col in KERNEL_FLOATS:
            assert np.array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(want)), col
            np.testing.assert_allclose(np.ma.getdata(got), np.ma.getdata(want), rtol=0, atol=1e-5, err_msg=col)
            continue
        same = np.array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(want)) and np.array_equal(
            np.ma.getdata(got), np.ma.getdata(want), equal_nan=np.asarray(want).dtype.kind == "f")
        assert same, col
