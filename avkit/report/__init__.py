"""`avkit report`: the pictures and tables people read (HTML + Markdown + PNG).

Reading order: document.py (the report as data) -> inputs.py (what it reads) -> sections/ (one
content block each) -> plots.py (matplotlib) -> html.py, markdown.py (renderers) -> build.py.
"""

from avkit.report.build import report_fit_dir, report_traces

__all__ = ["report_fit_dir", "report_traces"]
