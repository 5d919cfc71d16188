"""Build a report directory: index.html (self-contained), report.md, one PNG per figure, fit/.

  out/index.html   inline CSS, figures embedded as PNG data URIs (ReportConfig.embed)
  out/report.md    the same tables, figures linked
  out/*.png        the figures
  out/fit/         the fit outputs the report was made from (coefficients.json, scores.json,
                   trajectory.parquet): every number in the page can be checked against them
  out/simulate.parquet  when the report ran the simulation itself (no results were given or found)
Everything is written into a temporary directory beside `out`, which replaces `out` only when
complete (avkit/staged.py): a failed run leaves the previous report as it was.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import io
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from avkit import __version__
from avkit.config import EstimatorConfig, FitConfig, ReportConfig, SimulateConfig
from avkit.fit import run_fit, write_fit_outputs
from avkit.fit.run import FILES
from avkit.provenance import describe
from avkit.report.document import Figure, Report, Section
from avkit.report.inputs import ReportInputs, load_fit_dir, load_inputs
from avkit.report.render import render_html, render_markdown
from avkit.report.sections import SECTIONS
from avkit.scheduling.cost import resolve_cost
from avkit.sim.replay import simulate_and_write
from avkit.staged import StagedOutputs

Progress = Callable[[str], None]
# the results file behind a section (others: the fit); `tune` results record no inputs yet
SECTION_INPUT = {"simulation": "sim", "hybrid": "hvd", "tune": "tune"}


def _ignore(_: str) -> None:
    """The default `progress` and `warn`: say nothing."""


def build_document(inputs: ReportInputs, progress: Progress = _ignore) -> Report:
    """Run every section builder; a section with missing inputs comes back `omitted`, never raises."""
    sections: list[Section] = []
    for name, build in SECTIONS.items():
        progress(name)
        section = build(inputs)
        source = SECTION_INPUT.get(name, "fit")
        if source in inputs.records:
            section.inputs = describe(inputs.records[source])
            section.warnings += inputs.warnings.get(source, [])
        sections.append(section)
    c = inputs.fit.coefficients
    t = c.get("trained_on", {})
    facts = [("model pair", f"{t.get('target') or '?'} (target) / {t.get('draft') or '?'} (draft)"),
             ("fit", f"{inputs.fit.dir.name}/: {c['estimator']} on {c['feature']}, {c.get('mode', '?')} mode"),
             ("traces", ", ".join(p.name for p in inputs.traces) or "not at hand"),
             ("simulation", inputs.sources.get("sim", "none")),
             ("hybrid drafting", inputs.sources.get("hvd", "none")),
             ("tuning", inputs.sources.get("tune", "none")),
             ("reference figures", "quoted from the seeds, the source write-ups avkit was built from: vLLM's "
              "Adaptive Verification docs, two write-ups of vLLM PR #52228 (online acceptance estimator) and the "
              "Hybrid Verified Decoding paper; listed in docs/seeds.md. Other model pairs and hardware: "
              "compare shapes, not values"),
             ("inputs checked", "; ".join(w for ws in inputs.warnings.values() for w in ws)
              or "every results file records traces matching this report's (sha256)"),
             ("written", f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC by avkit {__version__}")]
    return Report("avkit report: acceptance, calibration and verification", facts, sections)


def write_document(report: Report, out: Path, config: ReportConfig) -> None:
    """Write the PNGs, index.html and report.md into `out` (an existing directory)."""
    files, embedded = {}, {}
    for f in (b for s in report.sections for b in s.blocks if isinstance(b, Figure)):
        buf = io.BytesIO()
        f.figure.savefig(buf, format="png", dpi=config.dpi, facecolor="white")
        (out / f"{f.name}.png").write_bytes(buf.getvalue())
        files[f.name] = f"{f.name}.png"
        embedded[f.name] = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    (out / "index.html").write_text(render_html(report, embedded if config.embed else files))
    (out / "report.md").write_text(render_markdown(report, files))


def report_fit_dir(fit_dir, out, config: ReportConfig | None = None, **kw) -> Path:
    """Report an `avkit fit` output directory (with the traces it names, when at hand) into `out`; keywords
    as `report_traces`'s but `fit` and `estimator`."""
    keep = load_fit_dir(fit_dir).dir
    return _report(out, config or ReportConfig(), lambda dest: shutil.copytree(
        keep, dest, ignore=lambda _, names: [n for n in names if n not in FILES]), **kw)


def report_traces(traces, out, config: ReportConfig | None = None, *, fit: FitConfig | None = None,
                  estimator: EstimatorConfig | None = None, progress: Progress = _ignore, **kw) -> Path:
    """Fit `traces` with the fit library (outputs kept in out/fit) and report them into `out`. Keywords:
    sim, hvd, tune (results files: a given one must exist; None: the config's when it exists), run_simulation
    (simulate the traces now, SimulateConfig defaults, when no sim file is given or found), progress, outputs (a
    StagedOutputs the caller commits; None: committed here), warn (called with each stale-input warning)."""
    paths, config = [Path(p) for p in traces], config or ReportConfig()
    progress("fit")
    if config.streaming() is not None:  # out of core: the fit too (a batch fit, report/traces.py)
        fit = replace(config.streaming(), mode=(fit or FitConfig()).mode, bins=(fit or FitConfig()).bins)
    result = run_fit(paths, fit, estimator)
    return _report(out, config, lambda dest: write_fit_outputs(dest, result), traces=paths, progress=progress, **kw)


def _report(out, config: ReportConfig, write_fit: Callable[[Path], object], *, traces=None, sim=None, hvd=None,
            tune=None, run_simulation: bool = False, progress: Progress = _ignore, outputs: StagedOutputs | None = None,
            warn: Progress = _ignore) -> Path:
    """Write the fit files (`write_fit`), gather the inputs and write the report into a temp directory that
    replaces `out` when the run succeeds (avkit/staged.py): reserved in `outputs`, else committed here."""
    out = Path(out)
    with contextlib.nullcontext(outputs) if outputs is not None else StagedOutputs() as staged:
        tmp = staged.directory(out)
        write_fit(tmp / "fit")
        fit = load_fit_dir(tmp / "fit")
        paths = [Path(p) for p in (traces or fit.coefficients.get("trained_on", {}).get("traces", []))]
        simulated = sim is None and run_simulation and config.streaming() is None and paths and \
            not Path(config.sim).expanduser().exists() and all(p.is_file() for p in paths)  # replayed in memory
        if simulated:
            progress("simulate")
            sim_config = SimulateConfig()
            sim = simulate_and_write(paths, resolve_cost(sim_config.cost), sim_config, tmp / "simulate.parquet",
                                     command="avkit report (simulated now)")[1]
        inputs = load_inputs(fit, traces, config, sim=sim, hvd=hvd, tune=tune)
        if simulated:
            inputs.sources["sim"] = f"simulated now with the avkit simulate defaults (cost model {SimulateConfig().cost})"
        for w in (w for ws in inputs.warnings.values() for w in ws):
            warn(w)
        write_document(build_document(inputs, progress), tmp, config)
    return out
