"""`avkit serve` bad input that needs the machine (a busy port, an unresolvable host, an unwritable
--record): one line on stderr naming the option and the value, exit code 2, before any model is loaded
(the target path does not even exist). Bad option values are in test_cli_bad_input.py."""

from __future__ import annotations

import socket

import pytest

from avkit.cli import app


@pytest.fixture()
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_busy_port_bad_host_and_unwritable_record_exit_2_with_one_line(tmp_path, capsys, busy_port):
    (tmp_path / "file").write_text("x")
    cases = [
        (["--port", str(busy_port)], f"--port {busy_port}: address already in use on 127.0.0.1"),
        (["--host", "10.255.255.1", "--api-key", "k"],
         "--host 10.255.255.1 --port 8000: cannot bind (Cannot assign requested address)"),
        (["--host", "256.0.0.1", "--api-key", "k"], "--host 256.0.0.1: cannot resolve it"),
        (["--record", str(tmp_path / "file" / "t.parquet")], f"--record {tmp_path}/file/t.parquet: {tmp_path}/file "
                                                              "is not a directory"),
        (["--record", str(tmp_path)], f"--record {tmp_path}: is a directory, expected a file path"),
        (["--record", str(tmp_path / "file")], f"--record {tmp_path}/file: exists; serve writes a new trace"),
    ]
    for args, message in cases:
        argv = ["serve", "--target", "/nonexistent/model", "--snapshot", str(tmp_path / "snap.json"), *args]
        with pytest.raises(SystemExit) as exit_info:
            app(argv, prog_name="avkit")
        assert exit_info.value.code == 2
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"avkit: error: {message}"), lines
    assert (tmp_path / "file").read_text() == "x"  # the existing file was left as it was


def test_api_key_help_warns_about_ps(capsys):
    with pytest.raises(SystemExit):
        app(["serve", "--help"], prog_name="avkit")
    help_text = " ".join(capsys.readouterr().out.split())
    assert "AVKIT_API_KEY" in help_text and "visible to every user in `ps`" in help_text.replace("│ ", "")
