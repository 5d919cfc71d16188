"""`avkit serve` bad input: one line on stderr naming the option and the value, exit code 2,
before any model is loaded (the target path does not even exist)."""

from __future__ import annotations

import pytest

from avkit.cli import app


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "0"], "max_concurrency must be in [1, inf], got 0"),
    (["--drafter", "oracle"], "drafter must be one of ['hybrid', 'model'], got 'oracle'"),
    (["--device", "cuda:x"], "device must be one of ['auto', 'cpu', 'cuda'] or cuda:N, got 'cuda:x'"),
    (["--dtype", "fp8"], "dtype must be one of ['auto', 'bfloat16', 'float32'], got 'fp8'"),
    (["--coefficients", "/nonexistent/coefficients.json", "--no-resume"],
     "--coefficients: no such file: /nonexistent/coefficients.json"),
])
def test_bad_options_exit_2_with_one_line(tmp_path, capsys, args, message):
    argv = ["serve", "--target", "/nonexistent/model", "--snapshot", str(tmp_path / "snap.json"), *args]
    with pytest.raises(SystemExit) as exit_info:
        app(argv, prog_name="avkit")
    assert exit_info.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == [f"avkit: error: {message}"]
