"""A Markdown table, built one way for every results file, report and data card (light: no imports)."""

from __future__ import annotations


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(columns, rows, numeric=None) -> str:
    """Header, alignment rule and one line per row of pre-formatted cells ('|' escaped, newlines flattened);
    `numeric`: a flag per column, right-aligned where set (default: every column but the first)."""
    numeric = numeric if numeric is not None else [False] + [True] * (len(columns) - 1)
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |",
             "|" + "|".join("---:" if num else "---" for num in numeric) + "|"]
    return "\n".join(lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows])


__all__ = ["md_table"]
