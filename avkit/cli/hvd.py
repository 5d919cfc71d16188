"""`avkit hvd`: replay recorded generations for Hybrid Verified Decoding; train the payoff predictor,
choose tau, score every router (the body of `avkit fit --hvd`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from avkit.cli.options import arg, config_options, result_table, stdout_console, traces_arg
from avkit.config import HvdCostConfig, HvdReplayConfig, PayoffConfig, SuffixCacheConfig
from avkit.hvd import METRICS, SPEEDUPS
from avkit.staged import StagedOutputs


def replay(paths: list[Path], out: Path, outputs, tokenizer: str | None = None, **kw):
    """The HVD replay of traces with generations tables, staged into `outputs` (`avkit hvd`, `avkit fit --hvd`);
    one warning line, once the inputs proved good, when the token-structure features fall back."""
    from avkit.hvd.fit import fit_hvd  # lazy: start-up

    result = fit_hvd(paths, out, tokenizer=tokenizer, outputs=outputs, **kw)
    if not result.info.get("structure_features", True) and tokenizer != "none":
        Console(stderr=True, soft_wrap=True).print(f"[bold yellow]warning:[/] {result.info['tokenizer']}", highlight=False)
    return result


def render(result, console: Console) -> None:
    from avkit.hvd.markdown import cells  # lazy: start-up

    cols, rows, _ = cells(result.metrics.filter(result.metrics["dataset"] == "overall").to_dicts(),
                          ("router", *METRICS, *SPEEDUPS))
    console.print(result_table("HVD routers (test split, overall)", cols, rows, left=("router",)))
    for f in result.files:
        console.print(f"wrote {f}")


def register(app: typer.Typer) -> None:
    @app.command("hvd")
    @config_options(
        (HvdReplayConfig, SuffixCacheConfig, HvdCostConfig, PayoffConfig),
        traces_arg("traces with .generations.parquet beside them (default: the greedy ones in traces/, else all)"),
        arg("out", Annotated[Path, typer.Option(help="output directory for payoff_mlp.pt and hvd_metrics.json")],
            Path("reports/hvd")),
        arg("tokenizer", Annotated[str | None, typer.Option(
            help="model path/alias for token-structure features (default: the trace's target, else the class "
                 "table shipped for it; 'none': leave them out)")], None),
        arg("markdown", Annotated[Path | None, typer.Option(help="also write a Markdown report here")], None),
        arg("synthetic", Annotated[int, typer.Option(help="replay N synthetic generations instead of traces")], 0),
        "k", "max_depth", "draft_step_cost",
        arg("cost_table", Annotated[Path | None, typer.Option(
            help="this device's measured step costs (`avkit profile` JSON): verify and draft curves replace "
                 "the linear model and --draft-step-cost (avkit/hvd/cost.py)", show_default=False)], None),
        "epochs", "seed")
    def hvd(replay_config: HvdReplayConfig, cache_config: SuffixCacheConfig, cost_config: HvdCostConfig,
            payoff_config: PayoffConfig, traces, out, tokenizer, markdown, synthetic, cost_table):
        """Replay greedy generations, fit the payoff predictor, compare routers (model, suffix, cache, arctic,
        table, mlp, survival) per dataset on held-out requests."""
        from avkit.hvd.cost import in_forwards, linear_table  # lazy: start-up
        from avkit.hvd.fit import fit_hvd_generations, reserve_hvd_outputs  # lazy: start-up
        from avkit.hvd.markdown import hvd_markdown  # lazy: start-up
        from avkit.scheduling.cost import CostTable  # lazy: start-up

        kw = {"cache_config": cache_config, "replay_config": replay_config, "payoff_config": payoff_config,
              "cost": in_forwards(CostTable.load(cost_table)) if cost_table is not None else
              linear_table(cost_config), "progress": sys.stderr.isatty()}
        with StagedOutputs() as outputs:  # the hvd files and --markdown are committed together, or none
            reserve_hvd_outputs(out, outputs, "--out")
            md = outputs.file(markdown, "--markdown") if markdown is not None else None
            if synthetic:
                from avkit.hvd.replay import synthetic_generations  # lazy: start-up

                result = fit_hvd_generations(synthetic_generations(synthetic, seed=payoff_config.seed), out, outputs=outputs, **kw)
                title = f"HVD replay on {synthetic} synthetic generations"
            else:
                from avkit.hvd.replay import greedy_traces  # lazy: start-up
                from avkit.trace.shards import resolve_shards  # lazy: start-up

                paths = resolve_shards(traces) if traces else greedy_traces()
                result = replay(paths, out, outputs, tokenizer, **kw)
                title = "HVD replay on " + ", ".join(p.name for p in paths)
            if md is not None:
                md.write_text(hvd_markdown(result, title))
                result.files.append(str(markdown))
        render(result, stdout_console(140))
