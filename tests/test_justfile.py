"""`just --list` shows one line per recipe: the `[doc(...)]` attribute, else the comment line right above the
recipe (just drops the lines above that one). A recipe documented by several comment lines needs a `[doc]`."""

import re
from pathlib import Path

JUSTFILE = Path(__file__).resolve().parents[1] / "justfile"
RECIPE = re.compile(r"^([a-z][a-z0-9-]*)(\s[^:]*)?:(\s|$)")  # `name params:` (not `name := value`)


def recipe_docs(text: str) -> dict[str, str | None]:
    """Each recipe -> the doc `just --list` shows for it, or None when it shows a cut comment or nothing."""
    lines = text.splitlines()
    docs = {}
    for i, line in enumerate(lines):
        m = RECIPE.match(line)
        if not m or ":=" in line:
            continue
        above = lines[i - 1] if i else ""
        doc = re.fullmatch(r'\[doc\("(.+)"\)\]', above)
        if doc:
            docs[m.group(1)] = doc.group(1)
        elif above.startswith("# ") and not (i > 1 and lines[i - 2].startswith("#")):
            docs[m.group(1)] = above[2:]
        else:
            docs[m.group(1)] = None
    return docs


def test_every_recipe_has_its_one_line_doc():
    docs = recipe_docs(JUSTFILE.read_text())
    assert len(docs) > 20 and "test" in docs
    assert [name for name, doc in docs.items() if doc is None] == []
    assert [name for name, doc in docs.items() if len(doc) > 120] == []


def test_the_rule_sees_a_cut_comment():
    text = "# one\n# two\nfirst:\n    true\n\n# alone\nsecond x='1':\n    true\n\n[doc(\"said\")]\nthird:\n    true\n"
    assert recipe_docs(text) == {"first": None, "second": "alone", "third": "said"}
