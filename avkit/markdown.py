"""A Markdown table and its cells' number format, one way for every results file, report, data card and
terminal table (light: stdlib only)."""

from __future__ import annotations

import math

DIGITS = 4  # the report's metrics (AUC, log-loss, ECE, coefficients) are printed with this many decimals


def fmt(x, digits: int = DIGITS) -> str:
    """One table cell: None / NaN -> '-', floats with `digits` decimals, everything else str().

    Examples
    --------
    >>> fmt(0.83361), fmt(float("nan")), fmt(12345.0, 0), fmt(4500000), fmt(True)
    ('0.8336', '-', '12,345', '4,500,000', 'yes')
    """
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:,.{digits}f}" if abs(x) >= 1e4 else f"{x:.{digits}f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(columns, rows, numeric=None) -> str:
    """Header, alignment rule and one line per row of pre-formatted cells ('|' escaped, newlines flattened);
    `numeric`: a flag per column, right-aligned where set (default: every column but the first)."""
    numeric = numeric if numeric is not None else [False] + [True] * (len(columns) - 1)
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |",
             "|" + "|".join("---:" if num else "---" for num in numeric) + "|"]
    return "\n".join(lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows])


__all__ = ["DIGITS", "fmt", "md_table"]
