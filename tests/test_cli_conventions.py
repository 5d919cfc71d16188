"""One set of CLI conventions: --version, -h, no Python types in help, one name per concept across
commands (and no other spelling of it), shell completion."""

import re
from dataclasses import replace

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
    assert "draft-gate" not in helps["serve"]  # the gate is the policy's: --policy adaptive[-stop]-nogate


def test_completion_is_offered(capsys, monkeypatch):
    _, out, _ = _run(capsys, monkeypatch, "--help")
    assert "--install-completion" in out and "--show-completion" in out
    # typer names the shell itself by looking for one among this process's ancestors (shellingham) and
    # fails with "Shell  not supported." where there is none (a detached CI job); with detection off,
    # (typer's own test switch) the option takes the shell's name as given
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    code, out, _ = _run(capsys, monkeypatch, "--show-completion", "bash")
    assert code == 0 and "_AVKIT_COMPLETE" in out and "complete -o default -F _avkit_completion avkit" in out


def test_repeated_policy_options(tmp_path, capsys, monkeypatch):
    from avkit.trace.synthetic import write_synthetic_trace

    trace = write_synthetic_trace(tmp_path / "t.parquet", SyntheticConfig(num_slots=3000, seed=2))
    out = tmp_path / "sim.parquet"
    code, _, err = _run(capsys, monkeypatch, "simulate", str(trace), "--policy", "nospec", "--policy", "fixed:3",
                        "--concurrency", "1", "--out", str(out))
    assert code in (0, None), err
    assert pl.read_parquet(out)["policy"].to_list() == ["nospec", "fixed3"]


def test_serve_policy_takes_simulate_syntax(monkeypatch, capsys, tmp_path):
    """serve parses --policy with simulate's parser (scheduling/spec.py `parse_spec`): the config it builds; a
    name is one policy (adaptive never stops drafting early, adaptive-stop does, as in simulate and record).
    The policy's argument and the option of the same field (--estimator, -k, --schedule) both given with equal
    values stand (different ones: test_cli_bad_input.py)."""
    import avkit.serve.server as server

    got = {}

    def fake_serve(config, **kw):
        got["config"] = config
        return False

    monkeypatch.setattr(server, "serve", fake_serve)
    sched = tmp_path / "schedule.json"
    sched.write_text('{"schedule": {"ranges": [[1, 4, 2], [5, 9, 1]]}}')
    cases = {("adaptive",): ("adaptive", "online_logistic", 7, True), ("adaptive:qmax",): ("adaptive", "qmax", 7, True),
             ("adaptive-nogate", "--estimator", "qmax"): ("adaptive", "qmax", 7, False),
             ("adaptive:qmax", "--estimator", "qmax"): ("adaptive", "qmax", 7, True),
             ("adaptive-stop",): ("adaptive-stop", "online_logistic", 7, True),
             ("adaptive-stop:qmax", "-k", "5"): ("adaptive-stop", "qmax", 5, True),
             ("adaptive-stop-nogate:qmax",): ("adaptive-stop", "qmax", 7, False),
             ("fixed:3",): ("fixed", "online_logistic", 3, True),
             ("fixed:3", "-k", "3"): ("fixed", "online_logistic", 3, True),
             ("fixed", "-k", "5"): ("fixed", "online_logistic", 5, True),
             ("fixed",): ("fixed", "online_logistic", 7, True),
             ("nospec",): ("fixed", "online_logistic", 0, True),
             ("nospec", "-k", "0"): ("fixed", "online_logistic", 0, True),
             (f"schedule:{sched}",): ("schedule", "online_logistic", 7, True),
             (f"schedule:{sched}", "--schedule", str(sched)): ("schedule", "online_logistic", 7, True),
             ("schedule", "--schedule", str(sched)): ("schedule", "online_logistic", 7, True)}
    from avkit.scheduling.policy import FullVerification
    from avkit.scheduling.spec import POLICIES

    class Mine(FullVerification):  # a plug-in policy, registered by name
        pass

    monkeypatch.setitem(POLICIES._entries, "mine", Mine)
    cases[("mine",)] = ("mine", "online_logistic", 7, True)
    for args, want in cases.items():
        _, _, err = _run(capsys, monkeypatch, "serve", "--policy", *args)
        c = got.pop("config", None)
        assert c is not None, (args, err)
        assert (c.policy, c.adaptive.estimator, c.engine.k, c.adaptive.draft_gate) == want, (args, err)
        assert c.schedule == (str(sched) if c.policy == "schedule" else ""), args
        if c.policy in ("fixed", "mine"):  # the object serve runs: PolicySpec.make's
            made = server.make_policy(c, "")
            assert isinstance(made, Mine) if c.policy == "mine" else made.k == c.engine.k
        if c.policy.startswith("adaptive"):  # the spec's entry alone decides the early stop and the gate
            made = server.make_policy(replace(c, adaptive=replace(c.adaptive, cost="roofline:cpu:1.5b")), "")
            assert made.stop_drafting is (c.policy == "adaptive-stop") and (made.gate is not None) is want[3]
