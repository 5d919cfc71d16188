"""`avkit report`: the pictures and tables people read (HTML + Markdown + PNG).

Reading order: document.py (the report as data) -> inputs.py (what it reads; traces.py: what it shows of
the traces) -> sections/ (one content block each) -> plots.py (matplotlib) -> render.py (HTML, Markdown)
-> build.py.
"""

from avkit.report.build import report_fit_dir, report_traces

__all__ = ["report_fit_dir", "report_traces"]
