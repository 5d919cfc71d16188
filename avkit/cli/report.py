"""`avkit report`: HTML + Markdown + PNG from a fit directory or traces, plus simulation and HVD results."""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from avkit.cli.options import arg, config_options, traces_arg
from avkit.config import DEFAULT_TRACE_GLOB, EstimatorConfig, FitConfig, ReportConfig, default_of
from avkit.errors import ConfigError
from avkit.staged import StagedOutputs

_d = functools.partial(default_of, ReportConfig)  # an option's default: its config field's


def split_inputs(inputs: list[Path] | None) -> tuple[Path | None, list[Path]]:
    """-> (FIT_DIR, []) for one directory, (None, traces) for trace files, shipped traces for none."""
    from avkit.trace.shards import trace_files  # lazy: polars

    # a directory of trace files (and no coefficients.json) is a shard set; any other one a FIT_DIR
    dirs = [p for p in inputs or () if p.is_dir() and ((p / "coefficients.json").is_file()
                                                       or not any(p.glob("*.parquet")))]
    if dirs and len(inputs) > 1:
        raise ConfigError(f"give one FIT_DIR or trace files, not both: {', '.join(map(str, inputs))}")
    return (dirs[0], []) if dirs else (None, trace_files(inputs))


def register(app: typer.Typer) -> None:
    @app.command("report")
    @config_options(
        (ReportConfig, FitConfig, EstimatorConfig),
        traces_arg(f"an `avkit fit` output directory, or trace files (directories, globs) to fit now (default: the "
                   f"shipped {DEFAULT_TRACE_GLOB})", "inputs", "FIT_DIR|TRACE"),
        "out",
        *(arg(name, Annotated[Path | None, typer.Option(help=f"{what} (default: {_d(name)} when it exists)",
                                                        show_default=False)], None)
          for name, what in (("sim", "`avkit simulate` results Parquet"),
                             ("hvd", "`avkit hvd` hvd_metrics.json or its directory"),
                             ("tune", "`avkit tune` result JSON"))),
        arg("simulate", Annotated[bool, typer.Option(
            help="with no --sim and no default results file: simulate the traces now (`avkit simulate` "
                 "defaults; seconds on the shipped traces)")], True),
        "mode", "feature", "bins", "embed", "engine", "memory_budget", "scratch",
        help={"mode": "fit mode when fitting traces: online | batch", "feature": "deployed feature when fitting traces",
              "memory_budget": "--engine streaming: MB of memory to stay under",
              "scratch": "--engine streaming: directory for the spilled observed slots (default: the system temp)"})
    def report(config: ReportConfig, fit: FitConfig, estimator: EstimatorConfig, inputs, sim, hvd, tune, simulate):
        """Write index.html (self-contained), report.md and the PNGs: summary, feature table, reliability
        diagrams, online fitting, simulation, tuning and hybrid drafting. Missing inputs omit their section."""
        out = Path(config.out)
        from avkit.report import report_fit_dir, report_traces  # lazy: start-up
        from avkit.report.sections import SECTIONS  # lazy: start-up
        from avkit.trace.reader import common_k  # lazy: start-up

        fit_dir, traces = split_inputs(inputs)
        console = Console(stderr=True)
        if traces and (note := common_k(traces)[1]):
            console.print(f"avkit report: {note}", soft_wrap=True)
        t0 = time.perf_counter()
        warnings: list[str] = []
        stages = ["fit", "simulate", *SECTIONS]
        with StagedOutputs() as outputs, Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal) as bar:
            outputs.directory(out, "--out")  # an unwritable --out fails now, before the fit
            task = bar.add_task("avkit report", total=len(stages))

            def progress(what: str) -> None:
                done = stages.index(what) if what in stages else bar.tasks[task].completed
                bar.update(task, completed=done, description=f"avkit report: {what}")

            kw = {"sim": sim, "hvd": hvd, "tune": tune, "run_simulation": simulate, "progress": progress,
                  "outputs": outputs, "warn": warnings.append}
            if fit_dir is not None:
                path = report_fit_dir(fit_dir, out, config, **kw)
            else:
                path = report_traces(traces, out, config, fit=replace(fit, bins=config.bins), estimator=estimator,
                                     **kw)
            bar.update(task, completed=len(stages))
        for w in warnings:
            console.print(f"[bold yellow]warning:[/] {w}", highlight=False)
        Console().print(f"wrote {path / 'index.html'} and {path / 'report.md'} "
                        f"({time.perf_counter() - t0:.1f} s)")
