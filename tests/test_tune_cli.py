"""`avkit tune` command line: formats on stdout, the result file, bad input as one line and exit 2."""

import json

import pytest

from conftest import run_cli
from avkit.config import SyntheticConfig
from avkit.trace.synthetic import write_synthetic_trace
from avkit.tune.formats import check_sglang, check_synthetic, check_trtllm, check_vllm, check_vllm_context

TINY = SyntheticConfig(num_slots=7 * 8 * 16 * 2, k=7, trim_prob=0.0, batch_size=8, steps_per_request=16, seed=2)
CHECKS = {"vllm": check_vllm, "vllm-context": check_vllm_context, "vllm-synthetic": check_synthetic,
          "trtllm": check_trtllm, "sglang": check_sglang}
FAST = ("--concurrency", "1,8", "--context", "1024", "--bootstrap", "20", "--max-k", "3")


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return write_synthetic_trace(tmp_path_factory.mktemp("tune_cli") / "t.parquet", TINY)


def _run(capsys, *args) -> tuple[int, str, str]:
    return run_cli(capsys, "tune", *args)


@pytest.mark.parametrize("fmt", ["vllm", "vllm-context", "vllm-synthetic", "trtllm", "sglang", "json"])
def test_formats_print_valid_json(capsys, trace, tmp_path, fmt):
    out_file = tmp_path / "tune.json"
    code, out, err = _run(capsys, trace, *FAST, "--format", fmt, "--out", out_file)
    assert code in (0, None), err
    payload = json.loads(out)
    saved = json.loads(out_file.read_text())
    if fmt == "json":
        assert payload == saved
    else:  # exactly the engine's payload (what --speculative-config and its peers take), nothing around it
        assert payload == saved[fmt.replace("-", "_")]
        if payload is not None:
            CHECKS[fmt](payload)
    if fmt == "vllm-context":
        assert "vLLM PR #48944 (not in vLLM 0.32)" in err
    assert saved["config"]["draft_gate"] is (fmt != "vllm")  # vLLM's adaptive verification has no gate
    assert "schedule (batch size: K)" in err


def test_table_format_and_slo_line(capsys, trace, tmp_path):
    code, out, err = _run(capsys, trace, *FAST, "--tpot-slo-ms", "0.001", "--out", tmp_path / "t.json")
    assert code in (0, None), err
    assert "fixed3" in out and "cannot be met at c=[1, 8]" in out and ">slo" in out


BAD = {
    "max-k above the traces' K": (("--max-k", "9"), "--max-k 9 exceeds the traces' K = 7"),
    "unknown format": (("--format", "yaml"), "--format must be one of"),
    "zero concurrency": (("--concurrency", "0,4"), "--concurrency must be integers >= 1, got 0,4"),
    "text concurrency": (("--concurrency", "a,b"), "--concurrency must be comma-separated integers, got a,b"),
    "negative slo": (("--tpot-slo-ms", "-1"), "--tpot-slo-ms must be >= 0, got -1"),
    "no context": (("--context", "0"), "no generations table beside it"),
    "missing cost": (("--cost", "/nonexistent/cost.json"), "cost table /nonexistent/cost.json: no such file"),
    "bad roofline": (("--cost", "roofline:H9000:8b"), "--cost roofline:H9000:8b: unknown accelerator H9000; choose from a100, "),
    "unknown estimator": (("--estimator", "magic"), "--estimator must be one of"),
    "out not json": (("--out", "x.txt"), "--out must be a .json path, got x.txt"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_exit_2(capsys, trace, tmp_path, case):
    extra, message = BAD[case]
    args = list(FAST)
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    if "--out" not in args:
        args += ["--out", tmp_path / "tune.json"]
    code, _, err = _run(capsys, trace, *args)
    assert code == 2, err
    assert err.startswith("avkit: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert message in err, err
    assert not (tmp_path / "tune.json").exists()


def test_missing_trace_file(capsys, tmp_path):
    code, _, err = _run(capsys, tmp_path / "nope.parquet", *FAST, "--out", tmp_path / "t.json")
    assert code == 2 and err.count("\n") == 1 and "nope.parquet" in err
