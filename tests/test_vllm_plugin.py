"""avkit's vLLM plugin in a real `vllm serve` and vLLM's own estimator (opt-in: `pytest -m vllm`).

avkit must be installed in vLLM's venv so its entry points register (`.ci/vllm` does `pip install -e .` there).
vLLM runs outside the checkout (cwd: a temp dir), as a user's does: the checkout's `avkit/` and `avkit.egg-info`
on sys.path would otherwise stand in for a missing install.
One vLLM server process on a tiny random Qwen2 pair (the draft is the target with noise: some drafts are
accepted, some rejected), started with the three environment variables of docs/vllm.md; a real OpenAI client
sends requests at concurrency 3, greedy and sampled. The oracles are vLLM's and independent code, never the
plugin's:
  * the trace's per-position accepted slots == vLLM's `vllm:spec_decode_num_accepted_tokens_per_pos_total`,
    verified slots == `..._num_draft_tokens_total`, request-steps == `..._num_drafts_total` (its /metrics);
  * the plugin's /metrics counters equal the same vLLM counters; its calibration gauges equal the trace's
    labelled slots scored with the coefficients by numpy, avkit.metrics.ece and a loop over request-steps;
  * the generations table holds one row per request, as long as the client's usage says;
  * the warm start: vLLM's own OnlineAcceptanceEstimator (on CPU under TRITON_INTERPRET, docs/vllm.md) starts
    at the file's slope and intercepts and predicts sigmoid(slope * logit(q_max) + b_j) with avkit's feature;
    a file fitted on another target is refused with one `avkit: error:` line and vLLM keeps its own start;
    with no AVKIT_* variable the plugin patches nothing.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import polars as pl
import pytest
import torch
from vllm_support import need_vllm, vllm_env, write_tiny_pair

from avkit.features import draft_features
from avkit.metrics import ece

pytestmark = pytest.mark.vllm

K = 3
PROMPTS = ["def add(a, b):", "for i in range(10):", "The quick brown fox", "import numpy as np",
           "class Stack:", "Hello, world! How are"]
COEF = {"schema_version": 1, "feature": "logit_qmax", "num_positions": K, "slope": 0.7,
        "intercepts": [0.3, 0.1, -0.1]}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    python = need_vllm()
    root = tmp_path_factory.mktemp("vllm_plugin")
    target, draft = write_tiny_pair(root)
    coef = root / "coefficients.json"
    coef.write_text(json.dumps({**COEF, "trained_on": {"target": str(target), "draft": str(draft)}}))
    return python, root, target, draft, coef


@pytest.fixture(scope="module")
def served(pair):
    """One `vllm serve` with the plugin; -> (trace path, vLLM's /metrics text, completion token counts)."""
    import openai  # lazy: heavy; in the test extra
    python, root, target, draft, coef = pair
    port, trace = _port(), root / "served.parquet"
    env = {**vllm_env(), "AVKIT_VLLM_TRACE": str(trace), "AVKIT_VLLM_COEFFICIENTS": str(coef),
           "AVKIT_VLLM_METRICS": "1", "AVKIT_VLLM_FLUSH_S": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": K}
    log = open(root / "serve.log", "w")
    proc = subprocess.Popen([str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(target),
                             "--port", str(port), "--dtype", "float32", "--max-model-len", "256", "--enforce-eager",
                             "--max-num-seqs", "4", "--seed", "0", "--speculative-config", json.dumps(spec)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, (root / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "vllm serve did not come up in 600 s"
            try:
                _get(f"http://127.0.0.1:{port}/health")
                break
            except OSError:
                time.sleep(2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")

        def ask(i: int) -> int:
            r = client.completions.create(model=str(target), prompt=PROMPTS[i], max_tokens=24, seed=i,
                                          temperature=1.0 if i in (1, 4) else 0.0)
            return r.usage.completion_tokens
        with cf.ThreadPoolExecutor(3) as pool:
            lengths = list(pool.map(ask, range(len(PROMPTS))))
        # the worker learns that the last requests finished when the next engine step starts: one more request
        client.completions.create(model=str(target), prompt="x", max_tokens=1, temperature=0.0)
        metrics = _get(f"http://127.0.0.1:{port}/metrics")
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    text = (root / "serve.log").read_text(errors="replace")
    # what the plugin said, on stderr (pytest shows it beside a failure) and in the message below
    said = "\n".join(line for line in text.splitlines() if "avkit" in line)
    print(said, file=sys.stderr)
    assert trace.exists(), f"the plugin wrote no trace; its lines on vLLM's log:\n{said}\nlog tail:\n{text[-4000:]}"
    return trace, metrics, lengths


def _samples(metrics: str, name: str) -> dict:
    """{position label or "": value} of one metric family's samples."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(metrics):
        for s in fam.samples:
            if s.name == name:
                out[s.labels.get("position", "")] = s.value
    return out


def _per_pos(metrics: str, name: str) -> list[float]:
    got = _samples(metrics, name)
    return [got.get(str(j), 0.0) for j in range(K)]


def test_trace_equals_vllms_prometheus_counters(served):
    trace_path, metrics, _ = served
    trace = pl.read_parquet(trace_path)
    acc = trace.filter(pl.col("accepted").fill_null(False)).group_by("position").len()
    per_pos = dict(zip(acc["position"].to_list(), acc["len"].to_list()))
    vllm_pos = _per_pos(metrics, "vllm:spec_decode_num_accepted_tokens_per_pos_total")
    assert [per_pos.get(j, 0) for j in range(K)] == vllm_pos
    assert sum(vllm_pos) > 0 and trace.filter(pl.col("accepted") == False).height > 0  # noqa: E712 both labels
    assert int(trace["verified"].sum()) == _samples(metrics, "vllm:spec_decode_num_draft_tokens_total")[""]
    assert trace.filter(pl.col("position") == 0).height == _samples(metrics, "vllm:spec_decode_num_drafts_total")[""]


def test_plugin_metrics_equal_vllms_counters_and_the_trace(served):
    trace_path, metrics, _ = served
    assert _per_pos(metrics, "avkit:spec_decode_accepted_slots_total") == \
        _per_pos(metrics, "vllm:spec_decode_num_accepted_tokens_per_pos_total")
    trace = pl.read_parquet(trace_path).with_columns(engine=pl.col("engine_step"))
    window = sorted(trace["engine_step"].unique().to_list())[-100:]  # health.WINDOW steps
    rows = trace.filter(pl.col("engine_step").is_in(window))
    lab = rows.filter(pl.col("accepted").is_not_null())
    assert _per_pos(metrics, "avkit:spec_decode_labelled_slots_total") == \
        [float(trace.filter(pl.col("accepted").is_not_null() & (pl.col("position") == j)).height) for j in range(K)]
    p = 1 / (1 + np.exp(-(COEF["slope"] * lab["logit_qmax"].to_numpy().astype(np.float64)
                          + np.asarray(COEF["intercepts"])[lab["position"].to_numpy()])))
    y = lab["accepted"].cast(pl.Float64).to_numpy()
    pos = lab["position"].to_numpy()
    predicted = _per_pos(metrics, "avkit:spec_decode_predicted_acceptance")
    observed = _per_pos(metrics, "avkit:spec_decode_observed_acceptance")
    for j in range(K):
        if (pos == j).any():
            assert predicted[j] == pytest.approx(p[pos == j].mean(), rel=1e-6)
            assert observed[j] == pytest.approx(y[pos == j].mean(), rel=1e-9)
    assert _samples(metrics, "avkit:spec_decode_brier")[""] == pytest.approx(((p - y) ** 2).mean(), rel=1e-6)
    assert _samples(metrics, "avkit:spec_decode_calibration_ece")[""] == pytest.approx(ece(y, p), rel=1e-6)
    expected, steps = 0.0, 0
    for _, g in rows.filter(pl.col("verified")).group_by("request_id", "step", "engine_step"):
        q = 1 / (1 + np.exp(-(COEF["slope"] * g.sort("position")["logit_qmax"].to_numpy().astype(np.float64)
                              + np.asarray(COEF["intercepts"])[g.sort("position")["position"].to_numpy()])))
        expected += float(np.cumprod(q).sum())
        steps += 1
    assert _samples(metrics, "avkit:spec_decode_expected_accepted_per_step")[""] == pytest.approx(expected / steps,
                                                                                                rel=1e-6)
    actual = rows.filter(pl.col("accepted").fill_null(False)).height / steps
    assert _samples(metrics, "avkit:spec_decode_actual_accepted_per_step")[""] == pytest.approx(actual, rel=1e-9)


def test_generations_table_has_every_request(served):
    trace_path, _, lengths = served
    gens = pl.read_parquet(trace_path.with_name(trace_path.stem + ".generations.parquet"))
    got = sorted(len(x) for x in gens["output_ids"].to_list())
    # the six requests, and the one-token request that followed when a later step saw it finish
    assert got == sorted(lengths) or got == sorted([*lengths, 1])
    trace = pl.read_parquet(trace_path)
    assert set(trace["request_id"].cast(pl.Utf8).unique().to_list()) <= set(gens["request_id"].to_list())


WARM = """
import json, logging, os, sys
sys.modules.update(torchvision=None, torchaudio=None, torchcodec=None)
from types import SimpleNamespace
import triton.backends as tb
tb.backends.setdefault("cpu", SimpleNamespace(driver=None))  # vLLM-CPU keeps Triton only with a "cpu" backend
import vllm.triton_utils  # noqa: F401  (its kernels now run in Triton's interpreter)
del tb.backends["cpu"]
import torch
from avkit.engines.vllm import plugin
from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import OnlineAcceptanceEstimator
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
good, bad, target, draft = sys.argv[1:5]
out = {}
plugin.register()  # no AVKIT_* variable: inert
out["inert"] = not hasattr(OnlineAcceptanceEstimator, "_avkit_warm_start") and not hasattr(GPUModelRunner, "_avkit_hooked")
os.environ["AVKIT_VLLM_COEFFICIENTS"] = good
plugin.register()
from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
from vllm.config.speculative import SpeculativeConfig
model = ModelConfig(model=target, tokenizer=target, dtype="float32")
spec = SpeculativeConfig(target_model_config=model, target_parallel_config=ParallelConfig(), method="draft_model",
                         model=draft, num_speculative_tokens=3)
errors = []
logging.getLogger("avkit.vllm").addHandler(type("H", (logging.Handler,), {"emit": lambda s, r: errors.append(r.getMessage())})())
with set_current_vllm_config(VllmConfig(model_config=model, speculative_config=spec)):
    est = OnlineAcceptanceEstimator(max_num_reqs=4, num_speculative_steps=3, device=torch.device("cpu"))
    out["refused"] = plugin.warm_start_coefficients(bad, 3) is None
out["slope"], out["intercepts"] = est.slope.tolist(), est.intercepts.tolist()
torch.manual_seed(0)
logits = torch.randn(4, 3, 1000) * 3
temp = torch.tensor([1.0, 0.0, 0.7, 1.3])
for step in range(3):
    est.predict(logits[:, step].contiguous(), torch.arange(4, dtype=torch.int32), torch.tensor(step, dtype=torch.int32),
                torch.zeros(4, 3), temp)
out["pred"] = est.predictions.tolist()
torch.save({"logits": logits, "temp": temp}, sys.argv[5])
out["errors"] = errors
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def warm(pair):
    python, root, target, draft, coef = pair
    bad = root / "other_pair.json"
    bad.write_text(json.dumps({**COEF, "trained_on": {"target": "/models/another-target", "draft": str(draft)}}))
    inputs = root / "warm_inputs.pt"
    env = {**{k: v for k, v in vllm_env().items() if not k.startswith("AVKIT_VLLM_")}, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([str(python), "-c", WARM, str(coef), str(bad), str(target), str(draft), str(inputs)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), torch.load(inputs)


def test_vllms_estimator_starts_from_the_coefficients_file(warm):
    got, inputs = warm
    assert got["inert"]
    assert got["slope"] == pytest.approx([COEF["slope"]], abs=1e-7)
    assert got["intercepts"] == pytest.approx(COEF["intercepts"], abs=1e-7)
    t = inputs["temp"]
    for step in range(K):  # vLLM's own kernels, avkit's feature and model: the same probability
        f = draft_features(inputs["logits"][:, step].double(), torch.where(t > 0, t, 1.0).double())["logit_qmax"]
        want = torch.sigmoid(COEF["slope"] * f + COEF["intercepts"][step])
        assert [row[step] for row in got["pred"]] == pytest.approx(want.tolist(), abs=1e-5)


def test_a_file_of_another_pair_is_refused_with_one_line(warm):
    got, _ = warm
    assert got["refused"]
    assert len(got["errors"]) == 1 and got["errors"][0].startswith("avkit: error: coefficients ")
    assert "trained_on.target" in got["errors"][0] and "keeps its own start" in got["errors"][0]
