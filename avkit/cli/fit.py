"""`avkit fit`: replay traces in engine-step order, fit estimators, score every feature."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from avkit.cli.hvd import render as render_hvd
from avkit.cli.hvd import replay
from avkit.cli.options import arg, config_options, result_table, stdout_console, traces_arg
from avkit.config import DEFAULT_TRACE_GLOB, EstimatorConfig, FitConfig
from avkit.errors import ConfigError
from avkit.markdown import fmt
from avkit.staged import StagedOutputs


def render(result, written: dict, console: Console) -> None:
    c = result.coefficients
    console.print(f"[bold]{c['estimator']}[/] on {c['feature']} ({c['mode']}): slope {c['slope']:.4f}, "
                  f"intercepts {' '.join(f'{b:+.3f}' for b in c['intercepts'])}, "
                  f"{c['trained_on']['observed']} observed of {c['trained_on']['slots']} slots")
    if c["mode"] == "online":
        from avkit.fit.data import CLOCKS  # lazy: start-up

        console.print(f"clock: {c['trained_on']['engine_steps']} engine steps from the "
                      f"{CLOCKS.get(c['clock'], 'engine_step column in some files, (request_id, step) groups in others')}"
                      f"; {c['refits']} refits every {c['refit_interval']} steps")
    rows = {(r["feature"], r["estimator"], r["scope"]): r for r in result.scores}
    console.print(result_table("scores (scope all / all_but_first)",
                               ("feature", "lossless", "estimator", "AUC", "log-loss", "ECE", "AUC >0", "n"),
                               [(feature, "yes" if r["lossless"] else "[red]NO[/]", est, fmt(r["auc"]),
                                 fmt(r["log_loss"]), fmt(r["ece"]),
                                 fmt(rows.get((feature, est, "all_but_first"), {}).get("auc")), str(r["n"]))
                                for (feature, est, scope), r in rows.items() if scope == "all"],
                               left=("feature", "estimator")))
    for path in written.values():
        console.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    @app.command("fit")
    @config_options(
        (FitConfig, EstimatorConfig),
        traces_arg(f"trace files, directories of them or globs: one shard per replica (default: the shipped "
                   f"{DEFAULT_TRACE_GLOB})"),
        "out", "mode", "estimator", "coefficients", "feature", "refit_interval", "bins", "engine", "address",
        "memory_budget", "scratch", "replicas", "drafter", "features",
        arg("hvd", Annotated[bool, typer.Option("--hvd", help="also replay the traces' generations tables for Hybrid "
                                                "Verified Decoding: payoff MLP, tau, routers -> OUT/hvd")], False))
    def fit(config: FitConfig, est_cfg: EstimatorConfig, traces, hvd):
        """Fit the acceptance estimator and score every feature; write coefficients.json, scores.json,
        trajectory.parquet into --out (atomically; nothing is written on bad input)."""
        out = Path(config.out)
        from avkit.fit import reserve_fit_outputs, run_fit, write_fit_outputs  # lazy: start-up
        from avkit.trace.reader import common_k  # lazy: start-up
        from avkit.trace.shards import trace_files  # lazy: polars

        paths = trace_files(traces)
        console = Console(stderr=True)
        with StagedOutputs() as outputs:  # the fit files and the --hvd files are committed together
            reserve_fit_outputs(out, outputs)
            with_gens = hvd_traces(paths, out / "hvd", outputs) if hvd else []
            if note := common_k(paths)[1]:
                console.print(f"avkit fit: {note}", soft_wrap=True)
            with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
                tasks: dict[str, int] = {}

                def progress(what: str, done: int, total: int) -> None:
                    if what not in tasks:
                        tasks[what] = bar.add_task(what, total=total)
                    bar.update(tasks[what], completed=done)

                result = run_fit(paths, config, est_cfg, progress=progress)
            written = write_fit_outputs(out, result, outputs)
            hvd_result = replay(with_gens, out / "hvd", outputs, progress=sys.stderr.isatty()) if hvd else None
        render(result, written, stdout_console())
        if hvd_result is not None:
            render_hvd(hvd_result, stdout_console(140))


def hvd_traces(paths: list[Path], out: Path, outputs) -> list[Path]:
    """`--hvd`, before any work: the traces with a generations table; the hvd files reserved in `out`."""
    from avkit.hvd.fit import reserve_hvd_outputs  # lazy: start-up
    from avkit.trace.schema import generations_path  # lazy: start-up

    with_gens = [p for p in paths if generations_path(p).is_file()]
    if not with_gens:
        raise ConfigError(f"--hvd: none of the traces has a generations table beside it ({paths[0]} ...)")
    reserve_hvd_outputs(out, outputs, "--out")
    return with_gens
