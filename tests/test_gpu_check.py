"""bench/gpu_check.py: the GPU check's own code on this CPU, so it cannot rot before a device is lent.

The dry run runs every step (gpu-marked pytest, kernels under Triton's interpreter, the engine checks, the
profile of random weights, `avkit tune` and `avkit hvd` on that table) at tiny sizes in a child process, as
the device would run it. A step that fails or overruns its limit is recorded in summary.json and the next
one still runs.
"""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["pytest", "kernels", "engine", "profile", "sim"]  # the check's steps, in order (docs/gpu.md)


def _check(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/gpu_check.py", "--dry-run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_dry_run_runs_every_step(tmp_path):
    out, bundle = tmp_path / "r", tmp_path / "r.tar.gz"
    p = _check("--out", str(out), "--bundle", str(bundle))
    summary = json.loads((out / "summary.json").read_text())
    failed = {k: v.get("error") or v for k, v in summary["steps"].items() if not v["ok"]}
    assert p.returncode == 0 and not failed, (failed, p.stderr[-3000:])
    assert list(summary["steps"]) == STEPS and summary["dry_run"]
    for f in ("pytest_gpu.xml", "kernels.json", "engine.json", "cost_tiny.json", "tune_tiny.json",
              "hvd/hvd_metrics.json", "hvd.md"):
        assert (out / f).is_file(), f
    engine = json.loads((out / "engine.json").read_text())
    assert set(engine) == {"greedy", "chi_square_t1", "triton_vs_torch"}
    assert summary["steps"]["pytest"]["tests"] >= 3  # the gpu-marked tests were collected (they skip here)
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert "r/summary.json" in names and not [n for n in names if n.endswith(".tmp")]


def test_a_failing_or_overrunning_step_is_recorded_and_the_run_goes_on(tmp_path):
    # sim with no cost table raises at once; kernels (~6 s of CPU interpreted) overruns what is left of a 3 s
    # budget and is stopped by its alarm; nothing is left for pytest
    out = tmp_path / "r"
    p = _check("--out", str(out), "--steps", "sim,kernels,pytest", "--budget-s", "3", timeout=120)
    steps = json.loads((out / "summary.json").read_text())["steps"]
    assert p.returncode == 1 and list(steps) == ["sim", "kernels", "pytest"], p.stderr[-3000:]
    assert steps["sim"]["error"].startswith("RuntimeError: no cost_*.json") and "Traceback" in steps["sim"]["traceback"]
    assert steps["kernels"]["error"].startswith("timed out after") and steps["kernels"]["seconds"] < 4
    assert steps["pytest"] == {"ok": False, "error": "skipped: the run's time budget is spent"}
