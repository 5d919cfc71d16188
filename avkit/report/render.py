"""Render a `Report`: one self-contained HTML page (inline CSS, no script, no network) and report.md.

HTML images are embedded as PNG data URIs (or referenced beside the page when `images` maps a figure
to a file name); wide tables scroll inside their own box, so the page itself never overflows. The
Markdown has the same tables, figures as PNG links.
"""

from __future__ import annotations

import jinja2

from avkit.markdown import md_table
from avkit.report.document import Figure, Report, Table

CSS = """
:root { --fg:#1f2328; --muted:#59636e; --line:#d1d9e0; --bg:#ffffff; --band:#f6f8fa; --accent:#0969da; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.55 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color:var(--fg);
       background:var(--bg); }
main { max-width: 1120px; margin: 0 auto; padding: 24px 28px 64px; }
header h1 { margin: 0 0 6px; font-size: 28px; }
dl.facts { display:grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 10px 0 18px;
           color: var(--muted); font-size: 13.5px; }
dl.facts dt { font-weight: 600; } dl.facts dd { margin: 0; overflow-wrap: anywhere; }
nav.toc { background: var(--band); border: 1px solid var(--line); border-radius: 8px; padding: 10px 16px;
          margin-bottom: 26px; font-size: 14px; }
nav.toc ol { margin: 4px 0; padding-left: 22px; } nav.toc a { color: var(--accent); text-decoration: none; }
nav.toc .omitted { color: var(--muted); }
section { margin-top: 34px; }
h2 { font-size: 21px; border-bottom: 1px solid var(--line); padding-bottom: 5px; }
p { max-width: 90ch; }
.inputs { color: var(--muted); font-size: 12.5px; margin: -4px 0 10px; overflow-wrap: anywhere; max-width: none; }
.note { background:#fff8c5; border:1px solid #d4a72c66; border-radius:6px; padding:8px 12px; }
.note.warn { background:#ffebe9; border-color:#ff818266; }
figure { margin: 18px 0; }
figure img { max-width: 100%; height: auto; display: block; border: 1px solid var(--line); border-radius: 6px; }
figcaption, .caption { color: var(--muted); font-size: 13px; margin-top: 6px; max-width: 100ch; }
.table-wrap { max-width: 100%; overflow-x: auto; margin: 14px 0; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 9px; text-align: left; white-space: nowrap; }
th { background: var(--band); font-weight: 600; white-space: normal; vertical-align: bottom; min-width: 5em; }
td.num, th.num { text-align: right; }
tbody tr:hover { background: #f0f6fc; }
td.em { font-weight: 700; }
details > summary { cursor: pointer; color: var(--accent); font-size: 14px; margin: 10px 0; }
footer { margin-top: 48px; color: var(--muted); font-size: 12.5px; }
"""

TEMPLATE = jinja2.Template("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ report.title }}</title><style>{{ css }}</style></head>
<body><main>
<header><h1>{{ report.title }}</h1>
<dl class="facts">{% for k, v in report.facts %}<dt>{{ k }}</dt><dd>{{ v }}</dd>{% endfor %}</dl></header>
<nav class="toc"><strong>Contents</strong><ol>
{% for s in report.sections %}<li>{% if s.omitted %}<span class="omitted">{{ s.title }} — omitted</span>
{% else %}<a href="#{{ s.key }}">{{ s.title }}</a>{% endif %}</li>
{% endfor %}</ol></nav>
{% for s in report.sections %}
<section id="{{ s.key }}"><h2>{{ s.title }}</h2>
{% if s.inputs and not s.omitted %}<p class="inputs">Inputs: {{ s.inputs }}</p>{% endif %}
{% for w in s.warnings %}<p class="note warn">{{ w }}</p>{% endfor %}
{% if s.omitted %}<p class="note">Omitted: {{ s.omitted }}</p>{% endif %}
{% for b in s.blocks %}
{% if b is string %}<p>{{ b }}</p>
{% elif b.figure is defined %}<figure><img src="{{ images[b.name] }}" alt="{{ b.alt or b.caption }}">
<figcaption>{{ b.caption }}</figcaption></figure>
{% else %}{% if b.collapsed %}<details><summary>{{ b.caption or "table" }} ({{ b.rows|length }} rows)</summary>{% endif %}
<div class="table-wrap"><table>
<thead><tr>{% for c in b.columns %}<th{% if b.numeric[loop.index0] %} class="num"{% endif %}>{{ c }}</th>{% endfor %}</tr></thead>
<tbody>{% for row in b.rows %}{% set i = loop.index0 %}<tr>{% for cell in row %}{% set j = loop.index0 %}
<td class="{{ 'num' if b.numeric[j] }}{{ ' em' if (i, j) in b.emphasis }}">{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table></div>
{% if not b.collapsed and b.caption %}<p class="caption">{{ b.caption }}</p>{% endif %}
{% if b.collapsed %}</details>{% endif %}{% endif %}
{% endfor %}</section>
{% endfor %}
<footer>Written by avkit report. Every metric is printed with 4 decimals from the fit's scores.json.</footer>
</main></body></html>
""", autoescape=True, trim_blocks=True, lstrip_blocks=True)


def render_html(report: Report, images: dict[str, str]) -> str:
    """`images`: figure name -> src (a data: URI or a file name beside the page)."""
    for s in report.sections:
        for b in s.blocks:
            assert isinstance(b, (str, Table, Figure)), f"unknown block {type(b)}"
            assert not isinstance(b, Figure) or b.name in images, f"no image for figure {b.name}"
    return TEMPLATE.render(report=report, images=images, css=CSS)


def table_md(t: Table) -> str:
    body = [tuple(f"**{c}**" if (i, j) in t.emphasis and c != "-" else c for j, c in enumerate(row))
            for i, row in enumerate(t.rows)]
    return md_table(t.columns, body, t.numeric) + (f"\n\n{t.caption}" if t.caption else "")


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
