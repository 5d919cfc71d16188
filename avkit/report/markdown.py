"""Render a `Report` as Markdown (report.md): the same tables as the HTML, figures as PNG links."""

from __future__ import annotations

from avkit.report.document import Figure, Report, Table


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_md(t: Table) -> str:
    head = "| " + " | ".join(_cell(c) for c in t.columns) + " |"
    rule = "|" + "|".join("---:" if num else "---" for num in t.numeric) + "|"
    body = ["| " + " | ".join(f"**{_cell(c)}**" if (i, j) in t.emphasis and c != "-" else _cell(c)
                              for j, c in enumerate(row)) + " |" for i, row in enumerate(t.rows)]
    caption = [f"\n{t.caption}"] if t.caption else []
    return "\n".join([head, rule, *body, *caption])


def render_markdown(report: Report, images: dict[str, str]) -> str:
    """`images`: figure name -> PNG file name beside report.md."""
    out = [f"# {report.title}", ""]
    out += [f"- **{k}**: {v}" for k, v in report.facts]
    for s in report.sections:
        out += ["", f"## {s.title}", ""]
        if s.inputs and not s.omitted:
            out += [f"*Inputs: {s.inputs}*", ""]
        out += [line for w in s.warnings for line in (f"> **Warning:** {w}", "")]
        if s.omitted:
            out += [f"> Omitted: {s.omitted}", ""]
        for b in s.blocks:
            if isinstance(b, Table):
                out += [table_md(b), ""]
            elif isinstance(b, Figure):
                out += [f"![{b.alt or b.caption}]({images[b.name]})", "", f"*{b.caption}*", ""]
            else:
                out += [b, ""]
    return "\n".join(out).rstrip() + "\n"


__all__ = ["render_markdown", "table_md"]
