"""`avkit record`: run workloads through the engine and stream one Parquet row per draft slot."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from avkit.cli.options import arg, config_options, result_table, stdout_console
from avkit.config import RecordConfig
from avkit.scheduling.spec import parse_spec
from avkit.workloads import WORKLOADS


def render(result, console: Console) -> None:
    console.print(result_table(
        f"{result.trace_path}  ({result.rows_total} rows, run {result.run_id})",
        ("dataset", "rows", "labelled", "per-slot acc", "tokens/step", "acceptance by position"),
        [(name, str(s["rows"]), str(s["labelled"]), f"{s['per_slot_acceptance']:.3f}", f"{s['tokens_per_step']:.2f}",
          " ".join(f"{a:.2f}" for a in s["acceptance_by_position"])) for name, s in result.summary.items()],
        left=("dataset", "acceptance by position")))
    if result.engine_counters:
        c = result.engine_counters
        console.print(f"vLLM's counters this run: {c.get('spec_decode_num_draft_tokens', 0)} draft tokens verified, "
                      f"accepted per position {c.get('spec_decode_num_accepted_tokens_per_pos', [])}")
    console.print(f"generations: {result.generations_path}  ({result.requests} requests finished this run"
                  + (f", {result.skipped_long} prompts skipped as too long" if result.skipped_long else "") + ")")


def register(app: typer.Typer) -> None:
    @app.command("record")
    @config_options(
        RecordConfig, "models.target", "models.draft", "dataset", "num_prompts", "sampling.max_new_tokens",
        "max_prompt_tokens", "decoding.k", "sampling.temperature", "sampling.top_p", "decoding.concurrency",
        "decoding.seed", "out", "resume", "overwrite", "slots_per_dataset", "flush_interval", "models.device",
        "models.dtype", "decoding.kernels", "threads", "models.drafter", "models.payoff", "engine", "vllm_python",
        "vllm_draft_sampling", "policy", "cost", "coefficients", "learn_cost", "cost_out",
        arg("progress", Annotated[bool, typer.Option(help="show the progress bar")], True),
        help={"dataset": f"a workload (docs/workloads.md: {', '.join(WORKLOADS)}) or FILE.jsonl (repeatable)",
              "seed": "prompt order and sampling seed"})
    def record(config: RecordConfig, progress: bool):
        """Record acceptance traces: one row per draft slot, streamed to Parquet in row groups."""
        parse_spec(config.policy)  # a bad --policy fails here, before torch loads (record builds it)
        from avkit.record import record as run  # lazy: start-up

        console = Console(stderr=True)
        result = run(config, progress=progress, console=console)  # checks every option before the models load
        render(result, stdout_console())  # the result: stdout
        if not result.committed:
            console.print(f"[yellow]interrupted:[/] {result.trace_path} was left as it was; the rows recorded so "
                          f"far are in {result.trace_path}.partial (and its generations); rerun with --resume "
                          "to continue them")
            raise typer.Exit(130)
        if result.interrupted:
            console.print("[yellow]interrupted:[/] files hold everything recorded so far; rerun with --resume")
            raise typer.Exit(130)
