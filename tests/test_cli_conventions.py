"""One set of CLI conventions (issue 22 item 4): --version, -h, no Python types in help, one name per
concept across commands, old spellings as hidden deprecated aliases, shell completion."""

import re

import polars as pl
import pytest

from avkit import __version__
from avkit.cli import app
from avkit.config import SyntheticConfig

COMMANDS = (["record"], ["fit"], ["hvd"], ["simulate"], ["profile"], ["serve"], ["report"], ["tune"],
            ["import", "vllm-metrics"], ["models", "fetch"], ["models", "list"], [])


def _run(capsys, monkeypatch, *argv):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exit_:
        app([*argv], prog_name="avkit")
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


def test_version(capsys, monkeypatch):
    code, out, _ = _run(capsys, monkeypatch, "--version")
    assert code == 0 and out.strip() == f"avkit {__version__}"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "avkit")
def test_short_help_and_no_python_types(capsys, monkeypatch, command):
    code, out, _ = _run(capsys, monkeypatch, *command, "-h")
    assert code == 0 and "Usage:" in out
    assert not re.search(r"<(bool|int|float|str|path|list\[[^\]]*\])>", out), out


def _help(capsys, monkeypatch, command: str) -> str:
    return _run(capsys, monkeypatch, command, "--help")[1]


def test_one_name_per_concept(capsys, monkeypatch):
    helps = {c: _help(capsys, monkeypatch, c) for c in ("record", "fit", "hvd", "simulate", "profile", "serve",
                                                         "report", "tune")}
    for c in ("record", "hvd", "profile", "serve"):  # every command that sets K
        assert re.search(r"--k\s+-k\b", helps[c]), c
    for c in ("record", "serve"):
        assert "--max-new-tokens" in helps[c], c
    for c in ("record", "simulate", "serve", "tune"):
        assert "--concurrency" in helps[c], c
    for c in ("simulate", "serve"):
        assert "--policy" in helps[c], c
    for c in ("fit", "hvd", "simulate", "tune"):
        assert re.search(r"\[TRACE\]\.\.\.", helps[c]), c
    old = ("--max-tokens-limit", "--max-concurrency", "--policies", "--max-tokens ")
    assert not [(c, o) for c, h in helps.items() for o in old if o in h]


def test_completion_is_offered(capsys, monkeypatch):
    _, out, _ = _run(capsys, monkeypatch, "--help")
    assert "--install-completion" in out and "--show-completion" in out
    code, out, _ = _run(capsys, monkeypatch, "--show-completion", "bash")
    assert code == 0 and "_AVKIT_COMPLETE" in out


def test_deprecated_spelling_still_works_with_a_warning(tmp_path, capsys, monkeypatch):
    from avkit.sim.replay import read_inputs
    from avkit.trace.synthetic import write_synthetic_trace

    trace = write_synthetic_trace(tmp_path / "t.parquet", SyntheticConfig(num_slots=3000, seed=2))
    out = tmp_path / "sim.parquet"
    code, _, err = _run(capsys, monkeypatch, "simulate", str(trace), "--policies", "nospec,fixed:2",
                        "--concurrency", "1", "--out", str(out))
    assert code in (0, None), err
    assert "avkit: warning: --policies is deprecated; use --policy" in err
    assert pl.read_parquet(out)["policy"].to_list() == ["nospec", "fixed2"]
    assert read_inputs(out)["policies"] == ["nospec", "fixed:2"]
    # serve: the old name reaches the same setting (its validation names it), before any model loads
    code, _, err = _run(capsys, monkeypatch, "serve", "--target", "/nonexistent", "--snapshot",
                        str(tmp_path / "s.json"), "--max-tokens-limit", "0")
    assert code == 2 and "--max-tokens-limit is deprecated; use --max-new-tokens" in err
    assert "max_tokens_limit must be in" in err


def test_repeated_policy_options(tmp_path, capsys, monkeypatch):
    from avkit.trace.synthetic import write_synthetic_trace

    trace = write_synthetic_trace(tmp_path / "t.parquet", SyntheticConfig(num_slots=3000, seed=2))
    out = tmp_path / "sim.parquet"
    code, _, err = _run(capsys, monkeypatch, "simulate", str(trace), "--policy", "nospec", "--policy", "fixed:3",
                        "--concurrency", "1", "--out", str(out))
    assert code in (0, None), err
    assert pl.read_parquet(out)["policy"].to_list() == ["nospec", "fixed3"]


def test_serve_policy_takes_simulate_syntax():
    from avkit.cli.serve import policy_spec
    from avkit.errors import ConfigError

    assert policy_spec("adaptive", "online_logistic", 7) == ("adaptive", "online_logistic", 7)
    assert policy_spec("adaptive:qmax", "online_logistic", 7) == ("adaptive", "qmax", 7)
    assert policy_spec("fixed:3", "online_logistic", 7) == ("fixed", "online_logistic", 3)
    with pytest.raises(ConfigError, match="fixed:K"):
        policy_spec("fixed:x", "online_logistic", 7)


def test_new_spelling_prints_no_deprecation_warning(tmp_path, capsys, monkeypatch):
    from avkit.trace.synthetic import write_synthetic_trace

    trace = write_synthetic_trace(tmp_path / "t.parquet", SyntheticConfig(num_slots=3000, seed=2))
    code, _, err = _run(capsys, monkeypatch, "simulate", str(trace), "--policy", "nospec", "--concurrency", "1",
                        "--out", str(tmp_path / "sim.parquet"))
    assert code in (0, None) and "deprecated" not in err, err
