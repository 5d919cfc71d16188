"""avkit's internal import graph has no cycle, and every function-level import says why it is late.

The graph is read with `ast` from the source (nothing is imported): an edge A -> B for every
`import avkit.B` / `from avkit.B import x` in A, at module level, inside a function or under
`if TYPE_CHECKING:`; `from avkit.P import sub` is an edge to the submodule and to the package P (importing
it runs P's `__init__`), except where P is A's own package. A cycle hidden behind a function-level or
type-checking import is still a cycle. A function-level import is allowed only with a
marker comment on its line (or the line above) naming the reason: `# lazy: torch` (a heavy library
kept out of start-up, or a module that imports one), `# optional: ray` (an extra that may be absent).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

AVKIT = Path(__file__).resolve().parents[1] / "avkit"
MARKER = re.compile(r"#\s*(lazy|optional):\s*\S")

# Function-level imports without a marker, per file (relative to avkit/). Shrinks to empty.
UNMARKED: dict[str, int] = {}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in AVKIT.rglob("*.py"):
        parts = list(path.relative_to(AVKIT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]):
    """(target module or None for an outside one, the import node, inside a function?) per import."""
    is_package = path.name == "__init__.py"

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield _resolve(alias.name, mods), child, inner
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = name.split(".") if is_package else name.split(".")[:-1]
                    package = package[: len(package) - (child.level - 1)]
                    base = ".".join(package + ([base] if base else []))
                if not (name + ".").startswith(base + "."):  # `from pkg import sub` runs pkg too (not an ancestor)
                    yield _resolve(base, mods), child, inner
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    yield _resolve(full if full in mods else base, mods), child, inner
            else:
                yield from walk(child, inner)

    return list(walk(ast.parse(path.read_text()), False))


def _resolve(target: str, mods: dict[str, Path]) -> str | None:
    while target and target not in mods:
        target = target.rpartition(".")[0]
    return target or None


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for target, _, _ in _imports(name, path, mods):
            if target is not None and target != name:
                graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(tuple(sorted(component)))
    return found


def test_cycle_finder_sees_a_late_import_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {("a", "b", "c")}
    assert _cycles({"a": {"b"}, "b": set()}) == set()


def test_edges_count_the_package_of_a_from_import_and_type_checking_blocks(tmp_path):
    """The before-stop hook's rule: `from pkg import sub` is an edge to pkg.sub and to pkg; an import under
    `if TYPE_CHECKING:` counts; `from . import sibling` inside pkg is no edge to pkg itself."""
    source = {
        "avkit/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from avkit.c import X\n",
        "avkit/b.py": "from avkit.pkg import sub\n",
        "avkit/c.py": "",
        "avkit/pkg/__init__.py": "from avkit import a\n",
        "avkit/pkg/sub.py": "from . import other\n",
        "avkit/pkg/other.py": "",
    }
    mods = {}
    for rel, text in source.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        parts = list(Path(rel).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges = {name: {t for t, _, _ in _imports(name, path, mods) if t and t != name} for name, path in mods.items()}
    assert edges["avkit.a"] == {"avkit.c"}
    assert edges["avkit.b"] == {"avkit.pkg", "avkit.pkg.sub"}
    assert edges["avkit.pkg.sub"] == {"avkit.pkg.other"}
    assert edges["avkit.pkg"] == {"avkit.a"}  # `from avkit import a`: avkit is its own package


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles (move the shared names down a module): {sorted(cycles)}"


def test_function_level_imports_say_why():
    mods = _modules()
    unmarked: Counter[str] = Counter()
    where: dict[str, list[int]] = {}
    for name, path in mods.items():
        lines = path.read_text().splitlines()
        nodes = {id(node): node for _, node, in_function in _imports(name, path, mods) if in_function}
        for node in nodes.values():
            span = lines[max(node.lineno - 2, 0): node.end_lineno]
            if not any(MARKER.search(line) for line in span):
                rel = path.relative_to(AVKIT).as_posix()
                unmarked[rel] += 1
                where.setdefault(rel, []).append(node.lineno)
    over = {f: (n, where[f]) for f, n in unmarked.items() if n > UNMARKED.get(f, 0)}
    assert not over, f"function-level imports without '# lazy: ...' / '# optional: ...': {over}"
    stale = {f: (n, unmarked.get(f, 0)) for f, n in UNMARKED.items() if unmarked.get(f, 0) < n}
    assert not stale, f"lower these UNMARKED allowances (allowed, now): {stale}"
