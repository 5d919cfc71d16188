"""The report as data: sections of paragraphs, tables and figures, rendered by render.py (HTML, Markdown).

Every number is formatted once, in a section (`avkit.markdown.fmt`), so the HTML and the Markdown show the
same strings and a test can compare them with the inputs (scores.json) at the printed precision.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from matplotlib.figure import Figure as MplFigure

from avkit.markdown import DIGITS, fmt


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]]  # pre-formatted cells, len(columns) each
    caption: str = ""
    numeric: tuple[bool, ...] = ()  # right-align these columns (default: all but the first)
    emphasis: frozenset[tuple[int, int]] = frozenset()  # (row, column) cells shown in bold
    collapsed: bool = False  # long reference tables: folded in HTML (<details>), full in Markdown

    def __post_init__(self):
        assert all(len(r) == len(self.columns) for r in self.rows), "ragged table"
        if not self.numeric:
            object.__setattr__(self, "numeric", (False,) + (True,) * (len(self.columns) - 1))


def record_table(rows, cols, **kw) -> Table:
    """One row per record (a dict): `cols` are (header, key, digits), the cell fmt(row[key], digits), str(row[key])
    where digits is None, or key(row) where key is a function."""
    cells = [tuple(key(r) if callable(key) else str(r[key]) if d is None else fmt(r.get(key), d) for _, key, d in cols)
             for r in rows]
    return Table(tuple(h for h, _, _ in cols), cells, **kw)


def grid_table(values: dict, head: str, rows, columns, digits: int = DIGITS, col_head=str, **kw) -> Table:
    """A row x column grid of `values[(row, column)]` (absent: '-'); the first column, headed `head`, names the row."""
    return Table((head, *map(col_head, columns)),
                 [(str(r), *(fmt(values.get((r, c)), digits) for c in columns)) for r in rows], **kw)


@dataclass(frozen=True)
class Figure:
    name: str  # PNG file stem, unique in the report
    caption: str
    figure: MplFigure  # drawn on the object-oriented API (no pyplot global state)
    alt: str = ""


Block = str | Table | Figure  # a paragraph, a table or a figure


@dataclass
class Section:
    key: str  # HTML anchor and registry name
    title: str
    blocks: list[Block] = field(default_factory=list)
    omitted: str = ""  # non-empty: the section is left out and this says why and how to add it
    inputs: str = ""  # what the section's numbers were made from (avkit/provenance.py), shown under the title
    warnings: list[str] = field(default_factory=list)  # stale or mismatched inputs, shown as notes

    def add(self, *blocks: Block | None) -> Section:
        """Append the blocks that are not None (an optional table left out)."""
        self.blocks.extend(b for b in blocks if b is not None)
        return self

    def omit(self, why: str) -> Section:
        self.omitted = why
        return self


@dataclass
class Report:
    title: str
    facts: list[tuple[str, str]]  # (label, value) lines under the title: inputs, model pair, time
    sections: list[Section]
