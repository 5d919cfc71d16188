"""bench/gpu_check.py: the GPU check's own code on this CPU, so it cannot rot before a device is lent.

The dry run runs every step (gpu-marked pytest, kernels under Triton's interpreter, the engine checks, the
profile of random weights, `avkit tune` and `avkit hvd` on that table) at tiny sizes in a child process, as
the device would run it; the step driver is checked in-process: a step that raises or overruns its limit is
recorded and the next one still runs, and summary.json always says what happened.
"""

import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402


def test_dry_run_runs_every_step(tmp_path):
    out, bundle = tmp_path / "r", tmp_path / "r.tar.gz"
    p = subprocess.run([sys.executable, "bench/gpu_check.py", "--dry-run", "--out", str(out), "--bundle", str(bundle)],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    summary = json.loads((out / "summary.json").read_text())
    failed = {k: v.get("error") or v for k, v in summary["steps"].items() if not v["ok"]}
    assert p.returncode == 0 and not failed, (failed, p.stderr[-3000:])
    assert list(summary["steps"]) == list(gpu_check.STEPS) and summary["dry_run"]
    for f in ("pytest_gpu.xml", "kernels.json", "engine.json", "cost_tiny.json", "tune_tiny.json",
              "hvd/hvd_metrics.json", "hvd.md"):
        assert (out / f).is_file(), f
    engine = json.loads((out / "engine.json").read_text())
    assert set(engine) == {"greedy", "chi_square_t1", "triton_vs_torch", "hybrid"}
    assert summary["steps"]["pytest"]["tests"] >= 4  # the gpu-marked tests were collected (they skip here)
    with tarfile.open(bundle) as tar:
        assert "r/summary.json" in tar.getnames()


def test_a_failing_or_overrunning_step_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    def overrun(ctx, limit):
        time.sleep(30)

    def fail(ctx, limit):
        raise ValueError("boom")

    monkeypatch.setattr(gpu_check, "RUNNERS", {"pytest": overrun, "kernels": fail,
                                               "engine": lambda ctx, limit: {"ok": True, "n": 1}})
    sizes = gpu_check.Sizes(**{**gpu_check.DRY.__dict__, "budget_s": {"pytest": 2.5, "kernels": 5, "engine": 5}})
    results = gpu_check.Results(tmp_path / "r", tmp_path / "b.tar.gz", {"device": "test"})
    ctx = gpu_check.Context(sizes, results, None, {})
    t0 = time.monotonic()
    assert not gpu_check.run_steps(ctx, ["pytest", "kernels", "engine"], budget_s=60)
    assert time.monotonic() - t0 < 10
    steps = json.loads((tmp_path / "r" / "summary.json").read_text())["steps"]
    assert steps["pytest"]["error"].startswith("timed out after")
    assert steps["kernels"]["error"] == "ValueError: boom" and "Traceback" in steps["kernels"]["traceback"]
    assert steps["engine"]["ok"] and steps["engine"]["n"] == 1
    assert (tmp_path / "b.tar.gz").is_file()
