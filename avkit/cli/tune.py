"""`avkit tune`: which K at which batch size, and whether adaptive verification pays; engine fragments."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from avkit.cli.options import ConcurrencyOption, CostOption, TracesArgument, parse_ints
from avkit.config import TuneConfig, default_of
from avkit.staged import write_json_atomic
from avkit.throughput_text import summary_lines, tune_grid


_d = functools.partial(default_of, TuneConfig)  # an option's default: its config field's


def render(result: dict, console: Console) -> None:
    """Throughput [interval] per arm x concurrency (chosen cell bold), infeasible columns, the schedule."""
    heads, rows = tune_grid(result)
    table = Table(title=f"predicted tokens/s ({result['config']['level']:.0%} bootstrap interval over requests); "
                        "bold: chosen")
    table.add_column(heads[0], no_wrap=True)
    for head in heads[1:]:
        table.add_column(head, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*(f"[bold]{text}[/]" if chosen else text for text, chosen in row))
    console.print(table)
    for line in summary_lines(result):
        console.print(line, markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("tune")
    def tune(
        traces: TracesArgument = None,
        cost: CostOption = _d("cost"),
        concurrency: ConcurrencyOption = ",".join(map(str, _d("concurrency"))),
        max_k: Annotated[int, typer.Option(help="largest K tried (0: the traces' K)")] = _d("max_k"),
        tpot_slo_ms: Annotated[float, typer.Option(help="p90 per-request ms per output token must stay under "
                                                        "this (0: no SLO)")] = _d("tpot_slo_ms"),
        context: Annotated[int, typer.Option(help="tokens per request for the KV-cache check (0: prompt + "
                                                  "generated from the traces)")] = _d("context"),
        memory_gb: Annotated[float, typer.Option(help="device memory, GB (0: from the cost table)")] =
            _d("memory_gb"),
        format: Annotated[str, typer.Option(help="stdout: table | json (everything) | vllm (exactly the "
                                                 "--speculative-config JSON) | vllm-context (5-item, vLLM PR "
                                                 "#48944's format) | vllm-synthetic | trtllm | sglang (its "
                                                 "--speculative-adaptive-config file)")] =
            _d("format"),
        draft: Annotated[str, typer.Option(help="the draft model vLLM loads (its HF directory; default: the "
                                                "traces' draft id)")] = _d("draft"),
        context_bands: Annotated[str, typer.Option(help="comma-separated upper bounds of context-length bands, "
                                                        "each tuned apart (e.g. 2047,8191,32767; a roofline "
                                                        "cost or a table with kv_ms_per_token)")]
            = "",
        draft_gate: Annotated[bool | None, typer.Option(
            help="simulate adaptive with avkit's draft gate (default: on, off for --format vllm: vLLM has "
                 "none)", show_default=False)] = None,
        estimator: Annotated[str, typer.Option(help="adaptive verification's estimator")] = _d("estimator"),
        bootstrap: Annotated[int, typer.Option(help="bootstrap resamples of the recorded requests")] =
            _d("bootstrap"),
        seed: Annotated[int, typer.Option(help="bootstrap seed")] = _d("seed"),
        out: Annotated[str, typer.Option(help="the whole result as JSON (read by `avkit report`)")] = _d("out"),
        datasets: Annotated[str, typer.Option(help="comma-separated: tune on these datasets' requests only, the "
                                                   "traffic the engine will serve (default: every request)")] = "",
        max_new_tokens: Annotated[int, typer.Option(help="the engine's cap on new tokens per request: the traces' "
                                                         "requests are cut there (0: as recorded)")] =
            _d("max_new_tokens"),
    ):
        """Per batch size: predicted tokens/s for no-spec, each fixed K, adaptive and adaptive with early stop;
        the recommended K per batch-size range, adaptive on or off, and the engine fragment."""
        config = TuneConfig(concurrency=parse_ints("concurrency", concurrency), cost=cost, max_k=max_k,
                            tpot_slo_ms=tpot_slo_ms, context=context, memory_gb=memory_gb, format=format,
                            draft_gate=draft_gate, estimator=estimator, bootstrap=bootstrap, seed=seed, out=out,
                            datasets=tuple(d.strip() for d in datasets.split(",")) if datasets else (),
                            max_new_tokens=max_new_tokens, draft=draft,
                            context_bands=parse_ints("context-bands", context_bands) if context_bands else ())
        from avkit.tune import tune as run  # lazy: start-up (the library loads when the command runs: -h stays fast)
        from avkit.tune.formats import UPSTREAM_CONTEXT_FORMAT  # lazy: polars

        from avkit.trace.shards import trace_files  # lazy: polars

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
