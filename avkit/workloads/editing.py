"""Code editing with reuse (`humaneval_edit`, docs/workloads.md): each HumanEval solution given back with one
edit to make (rename, hints, loop, bugfix), one prompt per edit that applies (prompt_id "HumanEval/0:rename").
Only `hints` rebuilds the code (`ast.unparse`); the others keep the original text outside the edited span."""

from __future__ import annotations

import ast
import random
import re

from avkit.workloads.base import Prompt
from avkit.workloads.sets import read_problems

REPLY = "Reply with the whole function in one code block."

# (pattern, replacement): single-token operator flips. A mutation applies when its pattern occurs in
# the solution body; the first occurrence is replaced.
MUTATIONS = (
    (r" < ", " <= "), (r" <= ", " < "), (r" > ", " >= "), (r" >= ", " > "),
    (r" == ", " != "), (r" != ", " == "), (r" \+ 1\b", " - 1"), (r" - 1\b", " + 1"),
    (r"\breturn True\b", "return False"), (r"\breturn False\b", "return True"),
    (r" and ", " or "), (r" or ", " and "), (r"\[1:\]", "[2:]"), (r"\[::-1\]", "[::1]"),
)


def new_name(name: str) -> str:
    """has_close_elements -> hasCloseElements; fib -> compute_fib."""
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest) if rest else f"compute_{name}"


def strip_hints(code: str, name: str) -> str:
    """The module with `name`'s annotations and docstring removed (ast round trip)."""
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            node.returns = None
            for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                arg.annotation = None
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree) + "\n"


def has_for(solution_code: str) -> bool:
    return any(isinstance(n, ast.For) for n in ast.walk(ast.parse(solution_code)))


def inject_bug(prompt: str, solution: str, rng: random.Random) -> str | None:
    """prompt + solution with one seeded operator flip in the solution, or None if none applies."""
    options = [(p, r) for p, r in MUTATIONS if re.search(p, solution)]
    if not options:
        return None
    pattern, repl = rng.choice(options)
    mutated = re.sub(pattern, repl, solution, count=1)
    try:
        ast.parse(prompt + mutated)
    except SyntaxError:  # a flip inside a string literal could break it; skip rather than guess
        return None
    return prompt + mutated


def edit_prompts(task_id: str, problem: dict, seed: int) -> list[Prompt]:
    """Every applicable edit of one HumanEval problem, as chat prompts."""
    code = problem["prompt"] + problem["canonical_solution"]
    name = problem["entry_point"]
    rng = random.Random(f"{seed}:{task_id}")  # per-problem stream: stable whatever the other problems
    edits: list[tuple[str, str, str]] = []  # (kind, code shown, instruction)
    edits.append(("rename", code, f"Rename the function `{name}` to `{new_name(name)}` and update every reference to it."))
    edits.append(("hints", strip_hints(code, name),
                  f"Add type hints to `{name}`'s signature and a docstring with its arguments, return value and an example."))
    if has_for(code):
        edits.append(("loop", code, "Rewrite every `for` loop in the function as an equivalent `while` loop."))
    buggy = inject_bug(problem["prompt"], problem["canonical_solution"], rng)
    if buggy is not None:
        edits.append(("bugfix", buggy, "This function has one bug. Find it and fix it."))
    return [
        Prompt("humaneval_edit", f"{task_id}:{kind}",
               messages=({"role": "user", "content": f"```python\n{shown}```\n\n{instruction} {REPLY}"},))
        for kind, shown, instruction in edits
    ]


def load_humaneval_edit(seed: int) -> list[Prompt]:
    return [p for task_id, problem in read_problems().items() for p in edit_prompts(task_id, problem, seed)]
