"""Tokens/s as people read them: the rounding rule and a predicted cell with its interval.

Light on purpose (no numpy, torch or matplotlib): the `avkit tune` table, the report's tune section and
the bench/ Markdown tables all print throughput through it.
"""

from __future__ import annotations


def tok(x: float) -> str:
    """Tokens/s for people: whole numbers from 100 up, one decimal below (a CPU's 4.2 tok/s).

    >>> tok(1234.6), tok(4.24)
    ('1,235', '4.2')
    """
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def cell_text(row: dict | None) -> str:
    """A predicted `avkit tune` cell: throughput (interval), " >slo" when its p90 TPOT is over the SLO."""
    if row is None:
        return "-"
    text = f"{tok(row['throughput_tok_s'])} ({tok(row['lo'])}-{tok(row['hi'])})"
    return text if row["meets_slo"] else text + " >slo"


__all__ = ["cell_text", "tok"]
