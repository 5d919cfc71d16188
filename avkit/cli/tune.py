"""`avkit tune`: which K at which batch size, and whether adaptive verification pays; engine fragments."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress

from avkit.cli.options import config_options, result_table, traces_arg
from avkit.config import TuneConfig
from avkit.staged import write_json_atomic
from avkit.throughput_text import summary_lines, tune_grid


def render(result: dict, console: Console) -> None:
    """Throughput [interval] per arm x concurrency (chosen cell bold), infeasible columns, the schedule."""
    heads, rows = tune_grid(result)
    console.print(result_table(
        f"predicted tokens/s ({result['config']['level']:.0%} bootstrap interval over requests); bold: chosen", heads,
        ([f"[bold]{text}[/]" if chosen else text for text, chosen in row] for row in rows), left=heads[:1],
        no_wrap=True))
    for line in summary_lines(result):
        console.print(line, markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("tune")
    @config_options(TuneConfig, traces_arg(), "cost", "concurrency", "max_k", "tpot_slo_ms",
                    "context", "memory_gb", "format", "draft", "context_bands", "draft_gate", "estimator",
                    "bootstrap", "seed", "out", "datasets", "max_new_tokens")
    def tune(config: TuneConfig, traces):
        """Per batch size: predicted tokens/s for no-spec, each fixed K, adaptive and adaptive with early stop;
        the recommended K per batch-size range, adaptive on or off, and the engine fragment."""
        from avkit.trace.shards import trace_files  # lazy: polars
        from avkit.tune import tune as run  # lazy: start-up
        from avkit.tune.formats import UPSTREAM_CONTEXT_FORMAT  # lazy: polars

        paths = [str(p) for p in trace_files(traces)]
        console = Console(stderr=True)
        bar = Progress(console=console, transient=True)  # started once the inputs are validated

        def progress(total: int):
            bar.start()
            task = bar.add_task("simulating", total=total)
            return lambda: bar.advance(task)
        try:
            result = run(paths, config, progress=progress,
                         warn=lambda line: console.print(f"avkit tune: warning: {line}", markup=False, highlight=False,
                                                       soft_wrap=True))
        finally:
            if bar.live.is_started:
                bar.stop()
        write_json_atomic(Path(config.out), result)
        width = 24 + 26 * (len(result["concurrency"]) + len(result["infeasible"]))  # one line per arm
        if config.format == "table":
            render(result, Console(width=width))
        else:
            render(result, Console(stderr=True, width=width))
            payload = result if config.format == "json" else result[config.format.replace("-", "_")]
            if config.format == "vllm-context":
                console.print(f"note: the 5-item form is {UPSTREAM_CONTEXT_FORMAT}")
            typer.echo(json.dumps(payload, indent=None if config.format.startswith("vllm") else 2))
        console.print(f"results: {config.out}")
