"""`avkit simulate`'s terminal table stays readable at 80 and 120 columns: short names with a legend, and
no number cut to an ellipsis (issue 22 item 3)."""

import re

import polars as pl
import pytest
from rich.console import Console

from avkit.sim.terminal import render_results, short_policy

POLICIES = ["nospec", *(f"fixed{k}" for k in range(1, 8)), "adaptive-online_logistic", "adaptive-qmax",
            "adaptive-stop-online_logistic", "adaptive-oracle"]
CONC = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def _frame() -> pl.DataFrame:
    rows = [{"policy": p, "concurrency": c, "throughput_tok_s": 1000.0 * c ** 0.6 * (1 + 0.01 * i),
             "vs_best_fixed": 0.9 + 0.01 * i} for i, p in enumerate(POLICIES) for c in CONC]
    return pl.DataFrame(rows)


@pytest.mark.parametrize("width", [80, 120])
def test_every_number_whole_and_every_line_fits(width):
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    df = _frame()
    render_results(df, console)
    text = console.export_text()
    assert "…" not in text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    for r in df.iter_rows(named=True):  # each cell printed in full somewhere
        assert f"{r['throughput_tok_s']:,.0f} ({r['vs_best_fixed']:.2f})" in text
    for p in POLICIES:  # short names on the rows, the long ones in the legend
        assert re.search(rf"^\s*{re.escape(short_policy(p))}\s", text, re.M)
    assert "A:ol = adaptive-online_logistic" in text and "not deployable" in text
    assert ("c=256" in text) and (text.count("policy") >= (2 if width == 80 else 1))


def test_short_names_are_distinct():
    names = POLICIES + ["adaptive-nogate-online_logistic", "adaptive-stop-nogate-online_logistic",
                        "adaptive-recorded"]
    shorts = [short_policy(p) for p in names]
    assert len(set(shorts)) == len(shorts) and max(map(len, shorts)) <= 18


@pytest.mark.parametrize("with_column", [True, False])
def test_bold_is_the_best_deployable_policy(with_column):
    """The oracle (the fastest row here) is a bound: the bold cell of each column is the best other policy, with
    the `lossless` column and without it (a results table written before the column), as the report marks it."""
    df = _frame()
    if with_column:
        df = df.with_columns(lossless=pl.col("policy") != "adaptive-oracle")
    console = Console(width=400, record=True, force_terminal=True, color_system="standard")
    render_results(df, console)
    bold = re.findall(r"\x1b\[1m([\d,]+) \(", console.export_text(styles=True))
    runner_up = df.filter(pl.col("policy") == "adaptive-stop-online_logistic").sort("concurrency")
    assert bold == [f"{x:,.0f}" for x in runner_up["throughput_tok_s"]]
