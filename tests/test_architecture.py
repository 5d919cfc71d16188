"""ARCHITECTURE.md names only what exists: every path, file, folder and module it puts in backticks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TICKED = re.compile(r"`([^`\s]+)`")
FILE = re.compile(r"^[\w*./-]+\.(py|md|json|toml|parquet|pt|cpp|h)$")
MODULE = re.compile(r"^avkit(\.\w+)+$")


def _named(text: str) -> list[str]:
    """The backticked words that are a path (a/b.py, a/, b.py, rejection*.py) or a dotted avkit module."""
    out = []
    for word in TICKED.findall(text):
        word = word.split(":")[0]  # `module.py:function`
        if FILE.match(word) or MODULE.match(word) or re.match(r"^[\w/-]+/$", word):
            out.append(word)
    return out


def _exists(word: str) -> bool:
    if MODULE.match(word):
        base = ROOT / word.replace(".", "/")
        return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()
    if "/" in word.rstrip("/"):  # a path from the repository root, or from avkit/
        return any(any(root.glob(word.rstrip("/"))) for root in (ROOT, ROOT / "avkit"))
    # a bare file or folder name, named inside its folder's row: somewhere under avkit/ (or at the root)
    name = word.rstrip("/")
    return any((ROOT / "avkit").rglob(name)) or (ROOT / name).exists()


def test_named_finds_paths_and_modules():
    assert _named("`avkit/fit/` and `plan.py:plan` and `avkit.runtime.engine`, not `avkit fit` nor `K`") == \
        ["avkit/fit/", "plan.py", "avkit.runtime.engine"]
    assert not _exists("avkit/no_such_file.py") and not _exists("budget.py") and _exists("rejection*.py")


def test_every_path_architecture_md_names_exists():
    named = _named((ROOT / "ARCHITECTURE.md").read_text())
    assert len(named) > 30
    missing = sorted({w for w in named if not _exists(w)})
    assert not missing, f"ARCHITECTURE.md names what does not exist: {missing}"
