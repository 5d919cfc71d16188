"""Open a report in headless Chromium: every image loads and no table overflows its box or the page.

Skips without a Chromium binary (`apt-get install chromium`). `AVKIT_REPORT=path/index.html` checks
that report instead of a synthetic one; `AVKIT_SCREENSHOT=file.png` keeps a screenshot of it
(`just test-browser` writes out/report_screenshot.png).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from avkit.config import ReportConfig, SyntheticConfig
from avkit.report import report_traces
from avkit.scheduling.cost import resolve_cost
from avkit.sim.replay import simulate, write_results
from avkit.trace.synthetic import write_synthetic_trace

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "headless_shell"))
                 if p), None)
pytestmark = [pytest.mark.browser, pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed")]
WIDTH = 1280  # a laptop-sized window

# Runs after load: opens every <details> so folded tables are measured too, then reports.
PROBE = """<script>
window.addEventListener("load", () => {
  document.querySelectorAll("details").forEach(d => d.open = true);
  const imgs = [...document.images].map(i => ({alt: i.alt, ok: i.complete && i.naturalWidth > 0}));
  const tables = [...document.querySelectorAll("table")].map(t => ({
    head: t.rows[0].cells[0].textContent, width: t.scrollWidth, box: t.parentElement.clientWidth}));
  const page = {width: document.documentElement.scrollWidth, view: document.documentElement.clientWidth};
  const pre = document.createElement("pre");
  pre.id = "avkit-probe";
  pre.textContent = JSON.stringify({imgs, tables, page});
  document.body.appendChild(pre);
});
</script>"""


def _chromium(*args: str, height: int = 2400) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--window-size={WIDTH},{height}", "--virtual-time-budget=15000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    if os.environ.get("AVKIT_REPORT"):
        return Path(os.environ["AVKIT_REPORT"]).resolve()
    root = tmp_path_factory.mktemp("browser")
    trace = write_synthetic_trace(root / "t.parquet", SyntheticConfig(num_slots=8_000, datasets=("code", "chat", "x"),
                                                                      mix=(1, 1, 1), feature_means=(2, 1, 0)))
    write_results(simulate([trace], resolve_cost("roofline:H200:8b"), (1, 16), ["nospec", "fixed", "adaptive:qmax"]),
                  root / "sim.parquet")
    out = report_traces([trace], root / "out", ReportConfig(hvd="/nonexistent"), sim=root / "sim.parquet")
    return out / "index.html"


def test_images_load_and_tables_fit(page, tmp_path):
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = _chromium("--dump-dom", probe.as_uri())
    found = json.loads(dom.split('<pre id="avkit-probe">')[1].split("</pre>")[0].replace("&quot;", '"')
                       .replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))
    assert found["imgs"] and all(i["ok"] for i in found["imgs"]), [i["alt"] for i in found["imgs"] if not i["ok"]]
    assert found["tables"]
    too_wide = [t for t in found["tables"] if t["width"] > t["box"] + 1]
    assert not too_wide, too_wide
    assert found["page"]["width"] <= found["page"]["view"] + 1, found["page"]


def test_screenshot(page, tmp_path):
    shot = tmp_path / "report.png"
    _chromium(f"--screenshot={shot}", page.as_uri(), height=3600)  # summary, feature table, reliability
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    img = matplotlib.image.imread(shot)[..., :3]  # [height, width, rgb] in [0, 1]
    # A rendered report is mostly white page with dark text, tables and plots: a blank or error page is not.
    dark = (img.mean(-1) < 0.5).mean()
    colours = len(np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    assert 0.005 < dark < 0.5 and colours > 50, (dark, colours)
    if os.environ.get("AVKIT_SCREENSHOT"):
        dest = Path(os.environ["AVKIT_SCREENSHOT"])
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, dest)
