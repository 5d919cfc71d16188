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
from avkit.throughput_text import cell_text, tok


_d = functools.partial(default_of, TuneConfig)  # an option's default: its config field's


def render(result: dict, console: Console) -> None:
    """Throughput [interval] per arm x concurrency (chosen cell bold), infeasible columns, the schedule."""
    conc = result["concurrency"]
    cells = {(r["arm"], r["concurrency"]): r for r in result["cells"]}
    chosen = {(r["arm"], r["concurrency"]) for r in result["schedule"]["per_concurrency"]}
    level = result["config"]["level"]
    table = Table(title=f"predicted tokens/s ({level:.0%} bootstrap interval over requests); bold: chosen")
    table.add_column("arm", no_wrap=True)
    for c in conc:
        table.add_column(f"c={c}", justify="right", no_wrap=True)
    for r in result["infeasible"]:
        table.add_column(f"c={r['concurrency']}", justify="right", no_wrap=True)
    for arm in dict.fromkeys(r["arm"] for r in result["cells"]):
        row = [f"[bold]{cell_text(cells.get((arm, c)))}[/]" if (arm, c) in chosen else cell_text(cells.get((arm, c)))
               for c in conc]
        table.add_row(arm, *row, *("infeasible (KV)" for _ in result["infeasible"]))
    console.print(table)
    for line in summary_lines(result):
        console.print(line, markup=False, highlight=False)


def change_lines(result: dict) -> list[str]:
    """One line per concurrency whose recommended K depends on the context band (none: one line saying so)."""
    s = result["schedule"]
    if "context_ranges" not in s:
        return []
    bands = [f"{lo}-{hi}" for lo, hi, _ in s["context_ranges"]]
    if not s["context_changes"]:
        return [f"context bands {', '.join(bands)} tokens: the same K at every concurrency"]
    return [f"  c={ch['concurrency']}: K " + ", ".join(f"{k if k is not None else 'infeasible'} at {b} tokens"
                                                     for k, b in zip(ch["k_by_band"], bands))
            for ch in s["context_changes"]]


def summary_lines(result: dict) -> list[str]:
    s = result["schedule"]
    ranges = ", ".join(f"{lo}-{hi}: K={k}" for lo, hi, k in s["ranges"])
    lines = [f"schedule (batch size: K): {ranges}; adaptive verification: {'on' if s['adaptive'] else 'off'} "
             f"(mean gain of adaptive at the same K: {s['adaptive_geomean_gain']:.3f}x)"]
    for r in s["per_concurrency"]:
        a, b = r["vs_single_k"], r["vs_nospec"]
        lines.append(f"  c={r['concurrency']}: {r['arm']} {tok(r['throughput_tok_s'])} tok/s; "
                     f"vs fixed K={s['single_k']} everywhere {a['ratio']:.3f}x [{a['lo']:.3f}, {a['hi']:.3f}], "
                     f"vs no-spec {b['ratio']:.3f}x [{b['lo']:.3f}, {b['hi']:.3f}]"
                     + ("" if r["meets_slo"] else "  (no arm meets the TPOT SLO)"))
    lines.append(f"overall (geometric mean over concurrencies): {s['geomean_vs_single_k']:.3f}x the best single "
                 f"fixed K (K={s['single_k']}), {s['geomean_vs_nospec']:.3f}x no-spec")
    stop = ", ".join(f"c{r['concurrency']} {r['stop_vs_recommended']['ratio']:.3f}x" for r in s["per_concurrency"])
    lines.append(f"avkit's engine (adaptive with early stop, K={result['max_k']}) vs this schedule: {stop}")
    if result["slo"]["tpot_ms"] > 0:
        unmet = result["slo"]["unmet"]
        lines.append(f"p90 TPOT SLO {result['slo']['tpot_ms']:g} ms: "
                     + (f"cannot be met at c={unmet}" if unmet else "met at every feasible concurrency"))
    for r in result["idle"]["per_concurrency"]:
        lines.append(f"  speculation configured but off at c={r['concurrency']}: at most "
                     f"{100 * r['overhead_share']:.1f}% of no-spec time (drafter prefill <= "
                     f"{100 * r['prefill_share']:.1f}%; keeping the drafter in sync {100 * r['sync_share']:.1f}% "
                     f"per step, or catching up <= {100 * r['catch_up_share']['64']:.1f}% after a 64-step pause)")
    if result["idle"]["per_concurrency"]:
        lines.append("  not priced: " + "; ".join(result["idle"]["not_priced"]))
    return lines + change_lines(result) + [f"note: {n}" for n in result["notes"]]


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
        gate = draft_gate if draft_gate is not None else format != "vllm"
        config = TuneConfig(concurrency=parse_ints("concurrency", concurrency), cost=cost, max_k=max_k,
                            tpot_slo_ms=tpot_slo_ms, context=context, memory_gb=memory_gb, format=format,
                            draft_gate=gate, estimator=estimator, bootstrap=bootstrap, seed=seed, out=out,
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
