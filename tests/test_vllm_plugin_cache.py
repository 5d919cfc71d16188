"""avkit's vLLM plugin with vLLM's cache drafters, `ngram` and `suffix`, in an offline `LLM` (opt-in: `pytest -m vllm`).

Cache drafters compute no draft logits: the plugin traces their slots with the features of a point mass (the q
vLLM verifies them against; hooks.CACHE_FEATURES) and their own draft lengths (<= K). One `LLM(...)` process per
method on the tiny random Qwen2 target, with AVKIT_VLLM_TRACE set and nothing else of avkit's started: the plugin
loads through its `vllm.general_plugins` entry point, as in a user's script. Greedy; prompts repeat themselves so
that prompt lookup finds matches, and two are asked twice, the twins after a slot frees (two run at a time), so the
suffix tree holds their first responses. The oracle is vLLM: per position, the trace's accepted slots == its
`spec_decode_num_accepted_tokens_per_pos`; verified slots == `num_draft_tokens`; request-steps == `num_drafts`; the
generations table holds vLLM's own outputs. `suffix` needs ArcticInference's suffix tree (.ci/vllm builds it): it
skips without it.
"""

from __future__ import annotations

import json
import subprocess

import polars as pl
import pytest
from vllm_support import need_vllm, vllm_env, write_tiny_pair

pytestmark = pytest.mark.vllm

K = 3
SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from avkit.engines.vllm import plugin
method, target, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec = {"method": method, "num_speculative_tokens": k}
if method == "ngram":
    spec |= {"prompt_lookup_max": 3, "prompt_lookup_min": 1}
llm = LLM(model=target, dtype="float32", max_model_len=256, max_num_seqs=2, enforce_eager=True, seed=0,
          disable_log_stats=False, async_scheduling=False, speculative_config=spec)
prompts = [[5, 6, 7, 8] * 3 + [5, 6], [9, 10, 11] * 2 + [9, 10], list(range(20, 40)) * 2]
prompts += prompts[:2]  # twins, admitted once a slot frees: the suffix tree holds their first responses
outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                    [SamplingParams(temperature=0, max_tokens=24, detokenize=False) for _ in prompts])
plugin.finish()
counters = {m.name.split(":", 1)[1]: (list(m.values) if hasattr(m, "values") else m.value)
            for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode_")}
print(json.dumps({"counters": counters, "outputs": sorted(list(o.outputs[0].token_ids) for o in outs)}))
"""


@pytest.fixture(scope="module", params=["ngram", "suffix"])
def run(request, tmp_path_factory):
    python = need_vllm()
    if request.param == "suffix":
        probe = subprocess.run([str(python), "-c", "import arctic_inference.suffix_decoding"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip(f"no arctic_inference suffix tree in {python} (python .ci/vllm_arctic.py --venv ...)")
    root = tmp_path_factory.mktemp(f"vllm_{request.param}")
    target, _ = write_tiny_pair(root)
    trace = root / "cache.parquet"
    env = {**vllm_env(), "AVKIT_VLLM_TRACE": str(trace), "AVKIT_VLLM_FLUSH_S": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    r = subprocess.run([str(python), "-c", SCRIPT, request.param, str(target), str(K)], capture_output=True, text=True,
                       timeout=900, env=env, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    return request.param, trace, json.loads(r.stdout.strip().splitlines()[-1])


def test_cache_drafts_are_traced_like_vllm_counts_them(run):
    method, trace_path, got = run
    trace, c = pl.read_parquet(trace_path), got["counters"]
    acc = trace.filter(pl.col("accepted").fill_null(False)).group_by("position").len()
    per_pos = dict(zip(acc["position"].to_list(), acc["len"].to_list()))
    assert [per_pos.get(j, 0) for j in range(K)] == c["spec_decode_num_accepted_tokens_per_pos"]
    assert int(trace["verified"].sum()) == c["spec_decode_num_draft_tokens"]
    assert trace.filter(pl.col("position") == 0).height == c["spec_decode_num_drafts"] > 0
    assert sum(per_pos.values()) > 0 and trace.filter(pl.col("accepted") == False).height > 0  # noqa: E712
    assert set(trace["drafter"].cast(pl.Utf8).unique()) == {method}
    assert (trace["q_max"] == 1).all() and (trace["q_sampled"] == 1).all() and (trace["num_drafted"] <= K).all()
    verified = trace.filter(pl.col("verified"))
    assert (verified["accept_prob"] == verified["target_prob"]).all()  # q(x) = 1: min(1, p / q) = p


def test_generations_are_vllms_outputs(run):
    _, trace_path, got = run
    gens = pl.read_parquet(trace_path.with_name("cache.generations.parquet"))
    assert sorted(gens["output_ids"].to_list()) == got["outputs"]
