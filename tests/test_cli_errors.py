"""Bad input to fit / simulate / hvd / report: one `avkit: error:` line naming the file, column, field or
argument and the bad value, exit 2, and every output that existed before left byte for byte as it was.
`avkit record`'s classes are in test_record.py (they need the tiny models); tests/README.md lists them all."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import run_cli
from avkit.config import SyntheticConfig
from avkit.errors import first_line
from avkit.staged import StagedOutputs
from avkit.trace.schema import generations_path
from avkit.trace.synthetic import write_synthetic_trace

K = 3


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("base")
    return write_synthetic_trace(root / "t.parquet", SyntheticConfig(num_slots=600, k=K, intercepts=(1.0, 0.5, 0.2)))


def _table(base: Path) -> pa.Table:
    return pq.read_table(base)


def _write(table: pa.Table, path: Path, gens: bool = False) -> Path:
    pq.write_table(table, path)
    if gens:  # a generations table beside it, so that `avkit hvd` gets as far as the trace
        ids = sorted(set(table["request_id"].cast(pa.string()).to_pylist())) or ["r0"]
        pq.write_table(pa.table({"request_id": ids, "dataset": ["code"] * len(ids),
                                 "prompt_ids": [[1, 2]] * len(ids), "output_ids": [[3, 4, 5]] * len(ids)}),
                       generations_path(path))
    return path


def _set(table: pa.Table, name: str, row: int, value, type_=None) -> pa.Table:
    values = table[name].to_pylist()
    values[row] = value
    arr = pa.array(values, type=type_ or table[name].type)
    return table.set_column(table.column_names.index(name), pa.field(name, arr.type), arr)


def _meta(table: pa.Table, **kv) -> pa.Table:
    meta = {**(table.schema.metadata or {}), **{k.replace("_", ".", 1).encode(): v.encode() for k, v in kv.items()}}
    return table.replace_schema_metadata(meta)


def one_line(code: int, err: str, match: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("avkit: error: "), (code, err)
    assert match in lines[0], lines[0]
    return lines[0]


def snapshot(*roots: Path) -> dict[Path, bytes]:
    """Every file under `roots` with its bytes (what must be unchanged after a failed command)."""
    return {p: p.read_bytes() for r in roots for p in sorted(Path(r).rglob("*")) if p.is_file()}


# ---- simulate (bad traces: also what every reader of traces refuses) ----
SIM = ("simulate", "--policy", "nospec,fixed", "--concurrency", "1,2", "--cost", "roofline:cpu:1.5b")


def _no_k(t: pa.Table) -> pa.Table:
    return t.replace_schema_metadata({k: v for k, v in t.schema.metadata.items() if k != b"avkit.k"})


BAD_TRACES = {
    "position 30000, no avkit.k": (lambda t: _set(_no_k(t), "position", 5, 30000),
                                   "column 'position' is >= 64 in a file without avkit.k metadata "
                                   "(K above 64 is refused): row 5 has position = 30000"),
    "position >= avkit.k": (lambda t: _set(t, "position", 7, 3), "column 'position' is >= K = 3 (avkit.k): row 7"),
    "avkit.k not an integer": (lambda t: _meta(t, avkit_k="7.5"), "metadata avkit.k is '7.5', expected an integer"),
    "duplicated row": (lambda t: pa.concat_tables([t, t.slice(4, 1)]),
                       "row 4 duplicates another row of the same draft slot"),
    "null in a non-null column": (lambda t: _set(t, "q_max", 2, None),
                                  "column 'q_max' is null (a required, non-null column): row 2"),
    "NaN step_time_ms": (lambda t: _set(t, "step_time_ms", 3, float("nan")),
                         "column 'step_time_ms' is not finite: row 3 has step_time_ms = nan"),
    "negative step_time_ms": (lambda t: _set(t, "step_time_ms", 3, -2.0),
                              "column 'step_time_ms' is negative: row 3 has step_time_ms = -2.0"),
    "num_accepted > num_verified": (lambda t: _set(t, "num_accepted", 0, 9),
                                    "column 'num_accepted' is outside [0, num_verified]: row 0"),
    "schema version 2": (lambda t: _meta(t, avkit_schema_version="2"), "avkit.schema_version is '2'"),
    "zero rows": (lambda t: t.slice(0, 0), "holds no rows"),
    "position stored as double": (lambda t: t.set_column(t.column_names.index("position"), "position",
                                                         t["position"].cast(pa.float64())),
                                  "column 'position' has type double, expected int16"),
}


@pytest.mark.parametrize("case", list(BAD_TRACES))
def test_simulate_bad_trace(case, base, tmp_path, capsys):
    change, match = BAD_TRACES[case]
    path = _write(change(_table(base)), tmp_path / "bad.parquet")
    code, _, err = run_cli(capsys, *SIM, "--out", tmp_path / "sim.parquet", path)
    line = one_line(code, err, match)
    assert str(path) in line
    assert not (tmp_path / "sim.parquet").exists() and sorted(os.listdir(tmp_path)) == ["bad.parquet"]


def test_simulate_same_file_twice(base, tmp_path, capsys):
    code, _, err = run_cli(capsys, *SIM, "--out", tmp_path / "sim.parquet", base, base)
    one_line(code, err, "given twice")


@pytest.mark.parametrize("out, match", [
    (lambda d: d, "is a directory, expected a file path"),
    (lambda d: d / "file.txt" / "sim.parquet", "file.txt is not a directory"),
    (lambda d: Path("/proc/avkit-no-such-dir/sim.parquet"), "cannot write there"),
])
def test_simulate_bad_out_fails_before_the_work(out, match, base, tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    before = snapshot(tmp_path)
    code, _, err = run_cli(capsys, *SIM, "--out", out(tmp_path), base)
    one_line(code, err, match)
    assert snapshot(tmp_path) == before


def test_simulate_bad_cost_file(base, tmp_path, capsys):
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"verify_tokens": [1, 2], "verify_ms": [1.0, float("inf")], "draft_requests": [1],
                                "draft_ms": [0.5]}))
    code, _, err = run_cli(capsys, "simulate", "--cost", cost, "--out", tmp_path / "s.parquet", base)
    one_line(code, err, f"cost table {cost}: field 'verify_ms'[1] must be a finite number, got inf")


def test_simulate_mixed_k_says_its_rule_and_writes_with_the_usual_mode(base, tmp_path, capsys):
    other = write_synthetic_trace(tmp_path / "k2.parquet", SyntheticConfig(num_slots=400, k=2, intercepts=(1.0, 0.5)))
    out = tmp_path / "sim.parquet"
    code, _, err = run_cli(capsys, *SIM, "--out", out, base, other)
    assert code == 0, err
    notes = [ln for ln in err.splitlines() if "different K" in ln]
    assert len(notes) == 1 and "t.parquet K=3, k2.parquet K=2" in notes[0] and "read at K = 3" in notes[0]
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask  # like every other output (not mkstemp's 0600)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left behind


# ---- fit ----
def test_fit_hvd_without_generations_keeps_the_previous_fit(base, tmp_path, capsys):
    out = tmp_path / "fit"
    code, _, err = run_cli(capsys, "fit", "--out", out, "--mode", "batch", base)
    assert code == 0, err
    before = snapshot(out)
    code, _, err = run_cli(capsys, "fit", "--out", out, "--mode", "batch", "--hvd", base)
    one_line(code, err, "--hvd: none of the traces has a generations table beside it")
    assert snapshot(out) == before and sorted(p.name for p in out.iterdir()) == sorted(before_names(before))


def before_names(snap: dict[Path, bytes]) -> list[str]:
    return [p.name for p in snap]


@pytest.mark.parametrize("out, match", [
    (lambda d: d / "file.txt", "exists and is not a directory"),
    (lambda d: Path("/proc/avkit-no-such-dir/fit"), "cannot write there"),
])
def test_fit_bad_out(out, match, base, tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    before = snapshot(tmp_path)
    code, _, err = run_cli(capsys, "fit", "--out", out(tmp_path), base)
    one_line(code, err, match)
    assert snapshot(tmp_path) == before


def test_fit_batch_never_ignores_an_online_estimator(base, tmp_path, capsys):
    code, _, err = run_cli(capsys, "fit", "--out", tmp_path / "fit", "--mode", "batch",
                           "--estimator", "forgetting_logistic", base)
    one_line(code, err, "--estimator forgetting_logistic: names the online estimator; --mode batch fits "
                        "batch_logistic")
    assert not (tmp_path / "fit").exists()


def test_fit_mixed_k_prints_the_rule(base, tmp_path, capsys):
    other = write_synthetic_trace(tmp_path / "k2.parquet", SyntheticConfig(num_slots=400, k=2, intercepts=(1.0, 0.5)))
    code, _, err = run_cli(capsys, "fit", "--out", tmp_path / "fit", "--mode", "batch", base, other)
    assert code == 0, err
    assert sum("different K" in ln for ln in err.splitlines()) == 1


# ---- hvd: the same validated reader ----
HVD_CASES = ["schema version 2", "zero rows", "position stored as double", "position >= avkit.k",
             "duplicated row"]


@pytest.mark.parametrize("case", HVD_CASES)
def test_hvd_reads_through_the_trace_contract(case, base, tmp_path, capsys):
    change, match = BAD_TRACES[case]
    path = _write(change(_table(base)), tmp_path / "bad.parquet", gens=True)
    code, _, err = run_cli(capsys, "hvd", "--out", tmp_path / "hvd", path)
    one_line(code, err, match)
    assert not (tmp_path / "hvd").exists()


def test_hvd_negative_position_and_missing_file(base, tmp_path, capsys):
    path = _write(_set(_table(base), "position", 1, -1), tmp_path / "neg.parquet", gens=True)
    code, _, err = run_cli(capsys, "hvd", "--out", tmp_path / "hvd", path)
    one_line(code, err, "column 'position' is negative: row 1 has position = -1")
    code, _, err = run_cli(capsys, "hvd", "--out", tmp_path / "hvd", tmp_path / "missing.parquet")
    one_line(code, err, f"{tmp_path / 'missing.parquet'}: no such trace file")


def test_hvd_duplicated_generation(base, tmp_path, capsys):
    path = _write(_table(base), tmp_path / "t.parquet", gens=True)
    g = pq.read_table(generations_path(path))
    pq.write_table(pa.concat_tables([g, g.slice(0, 1)]), generations_path(path))
    code, _, err = run_cli(capsys, "hvd", "--out", tmp_path / "hvd", path)
    one_line(code, err, "repeats request_id")


@pytest.mark.parametrize("markdown, match", [
    (lambda d: d, "--markdown"),
    (lambda d: Path("/proc/avkit-no-such-dir/hvd.md"), "cannot write there"),
])
def test_hvd_unwritable_markdown_keeps_the_previous_outputs(markdown, match, tmp_path, capsys):
    out = tmp_path / "hvd"
    out.mkdir()
    for name in ("payoff_mlp.pt", "payoff_survival.pt", "hvd_metrics.json"):
        (out / name).write_text(f"previous {name}")
    before = snapshot(tmp_path)
    code, _, err = run_cli(capsys, "hvd", "--synthetic", "40", "--epochs", "1", "--out", out,
                           "--markdown", markdown(tmp_path))
    one_line(code, err, match)
    assert snapshot(tmp_path) == before


# ---- report: a damaged FIT_DIR ----
@pytest.fixture(scope="module")
def fit_dir(base, tmp_path_factory) -> Path:
    from avkit.config import FitConfig
    from avkit.fit import run_fit, write_fit_outputs

    out = tmp_path_factory.mktemp("fit") / "fit"
    write_fit_outputs(out, run_fit([base], FitConfig(mode="batch")))
    return out


DAMAGE = {
    "coefficients.json not UTF-8": ("coefficients.json", b"\xff\xfe{", "coefficients.json: not valid JSON"),
    "coefficients.json a list": ("coefficients.json", b"[1, 2]", "coefficients.json: must be a JSON object, got list"),
    "coefficients.json slope a string": ("coefficients.json", json.dumps(
        {"feature": "logit_qmax", "num_positions": 1, "slope": "x", "intercepts": [0.1], "estimator": "e"}).encode(),
        "field 'slope'"),
    "scores.json rows not objects": ("scores.json", b"[1, 2]", "scores.json: row 0 is not an object: 1"),
    "trajectory.parquet damaged": ("trajectory.parquet", b"PAR1 not parquet", "trajectory.parquet: not a readable"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_report_damaged_fit_dir(case, fit_dir, tmp_path, capsys):
    import shutil

    name, content, match = DAMAGE[case]
    damaged = tmp_path / "fit"
    shutil.copytree(fit_dir, damaged)
    (damaged / name).write_bytes(content)
    out = tmp_path / "report"
    code, _, err = run_cli(capsys, "report", damaged, "--out", out, "--no-simulate")
    one_line(code, err, match)
    assert not out.exists()


def test_report_out_is_a_file(fit_dir, tmp_path, capsys):
    (tmp_path / "r").write_text("x")
    code, _, err = run_cli(capsys, "report", fit_dir, "--out", tmp_path / "r", "--no-simulate")
    one_line(code, err, "--out")
    assert (tmp_path / "r").read_text() == "x"


def test_an_error_line_quotes_the_first_line_or_the_type_of_an_empty_message():
    assert first_line(OSError("bad page\ndetails")) == "bad page"
    assert first_line(ValueError()) == "ValueError"  # str(e).splitlines()[0] raised IndexError here


# ---- the staged-outputs mechanism itself ----
def test_staged_outputs_commit_all_or_none(tmp_path):
    a, b, d = tmp_path / "a.txt", tmp_path / "sub" / "b.txt", tmp_path / "dir"
    a.write_text("old a")
    d.mkdir()
    (d / "old").write_text("old dir")
    with pytest.raises(RuntimeError), StagedOutputs() as out:
        out.file(a).write_text("new a")
        out.file(b).write_text("new b")
        (out.directory(d) / "new").write_text("new dir")
        raise RuntimeError("the work failed after writing")
    assert a.read_text() == "old a" and not (tmp_path / "sub").exists() and os.listdir(d) == ["old"]
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "dir"]  # no temp left behind
    with StagedOutputs() as out:
        out.file(a).write_text("new a")
        out.file(b).write_text("new b")
        (out.directory(d) / "new").write_text("new dir")
        assert a.read_text() == "old a"  # nothing is visible before the commit
    assert a.read_text() == "new a" and b.read_text() == "new b" and os.listdir(d) == ["new"]
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "dir", "sub"]


def test_staged_discard_keeps_the_old_file(tmp_path):
    a = tmp_path / "a.txt"
    a.write_text("old")
    with StagedOutputs() as out:
        out.file(a)
        out.discard(a)
    assert a.read_text() == "old" and os.listdir(tmp_path) == ["a.txt"]


def test_a_signal_taken_by_another_thread_is_delivered_after_the_block_not_inside():
    """`kill` aims SIGINT at the process: a thread that does not block it (an OpenMP or polars worker) takes
    it and trips Python's flag, and the main thread raised KeyboardInterrupt at its next check inside the
    body although it had blocked the signal (mid-abort: CI left a temp twice). It must wait for the end."""
    import os
    import signal
    import threading

    from avkit.staged import deferred_signals

    go = threading.Event()
    worker = threading.Thread(target=lambda: (go.wait(), os.kill(os.getpid(), signal.SIGINT)))
    worker.start()  # started before the block: its signal mask is not the block's
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_signals():
            go.set()
            worker.join()
            for i in range(1000):
                steps.append(i)  # many checks: none may raise here
        steps.append("after")  # not reached: delivered as the block ends
    assert steps == list(range(1000))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


def test_three_quick_sigints_during_fit_leave_no_traceback_and_no_partial_outputs(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    trace = write_synthetic_trace(tmp_path / "big.parquet", SyntheticConfig(num_slots=300_000))
    out = tmp_path / "fit"
    out.mkdir()
    (out / "coefficients.json").write_text("previous")
    proc = subprocess.Popen([sys.executable, "-m", "avkit", "fit", "--out", str(out), str(trace)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while not any(p.name.endswith(".tmp") for p in out.iterdir()) and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.01)  # the outputs are reserved: the command is past its imports, in the work
    assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
    for _ in range(3):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.01)
    _, err = proc.communicate(timeout=120)
    err = err.decode()
    assert proc.returncode != 0 and "Traceback" not in err, err[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["coefficients.json"]  # temps removed, nothing committed
    assert (out / "coefficients.json").read_text() == "previous"
