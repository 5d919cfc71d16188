"""Sharded trace input: files, directories and globs resolve in order; shards that do not belong
together (model pair, schema) are named in one line, by the library and by every command."""

import json

import pyarrow.parquet as pq
import pytest

from avkit.cli import app
from avkit.config import SyntheticConfig
from avkit.errors import TraceError
from avkit.trace.shards import check_shards, resolve_shards
from avkit.trace.synthetic import synthetic_trace, write_synthetic_trace


@pytest.fixture
def fleet(tmp_path):
    d = tmp_path / "fleet"
    paths = [write_synthetic_trace(d / f"replica-{i}.parquet", SyntheticConfig(num_slots=1_400, seed=i))
             for i in range(3)]
    (d / "replica-0.generations.parquet").write_bytes(b"not a trace")  # a companion table is skipped
    return d, paths


def _write(path, **meta):
    t = synthetic_trace(SyntheticConfig(num_slots=700, seed=5))
    t = t.replace_schema_metadata({**t.schema.metadata, **{k.encode(): v.encode() for k, v in meta.items()}})
    pq.write_table(t, path)
    return path


def test_directory_glob_and_files_resolve_in_order_without_repeats(fleet):
    d, paths = fleet
    assert resolve_shards([d]) == paths
    assert resolve_shards([str(d / "replica-[12].parquet")]) == paths[1:]
    assert resolve_shards([paths[2], str(d / "replica-[01].parquet")]) == [paths[2], paths[0], paths[1]]
    with pytest.raises(TraceError, match="given twice"):
        resolve_shards([paths[2], d])
    s = check_shards([d])
    assert s.paths == tuple(paths) and s.meta["avkit.k"] == "7"


@pytest.mark.parametrize("spec", ["missing.parquet", "replica-*.nothing", "empty"])
def test_nothing_to_read_is_named(tmp_path, spec):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match=spec.replace("*", r"\*")):
        resolve_shards([tmp_path / spec])


@pytest.mark.parametrize("key,value", [("avkit.draft", "another/draft"), ("avkit.target", "another/model"),
                                       ("avkit.draft_sha256", "00ff")])
def test_a_shard_that_disagrees_is_named_with_both_values(fleet, key, value):
    d, paths = fleet
    odd = _write(d / "replica-9.parquet", **{key: value})
    with pytest.raises(TraceError) as e:
        check_shards([d])
    msg = str(e.value)
    assert msg.startswith(f"shard {odd}: {key} is {value!r}") and str(paths[0]) in msg and "\n" not in msg


def test_a_shard_with_a_broken_schema_is_named(fleet):
    d, _ = fleet
    bad = _write(d / "replica-5.parquet", **{"avkit.schema_version": "9"})
    with pytest.raises(TraceError, match=f"{bad}: avkit.schema_version is '9'"):
        check_shards([d])


@pytest.mark.parametrize("command", ["fit", "simulate"])
def test_commands_name_the_disagreeing_shard(capsys, fleet, tmp_path, command):
    d, _ = fleet
    odd = _write(d / "replica-7.parquet", **{"avkit.target": "another/model"})
    with pytest.raises(SystemExit) as exit_:
        app([command, str(d), "--out", str(tmp_path / "out")], prog_name="avkit")
    err = capsys.readouterr().err
    line = err.splitlines()[-1]  # (main's fit may warn about K on a line of its own first)
    assert exit_.value.code == 2 and err.count("avkit: error:") == 1 and f"shard {odd}: avkit.target is 'another/model'" in line
    assert not (tmp_path / "out").exists()


def test_fit_of_a_directory_equals_fit_of_its_files(capsys, fleet, tmp_path):
    d, paths = fleet
    for args, out in (([d], "a"), (paths, "b")):
        with pytest.raises(SystemExit) as exit_:
            app(["fit", *map(str, args), "--out", str(tmp_path / out)], prog_name="avkit")
        assert exit_.value.code in (0, None), capsys.readouterr().err
    a, b = (json.loads((tmp_path / o / "coefficients.json").read_text()) for o in "ab")
    for doc in (a, b):
        doc["trained_on"]["inputs"]["written"] = None  # the time each fit wrote its file
    assert a == b and "observed" in a["trained_on"]
