"""`avkit record`: run workloads through the engine and stream one Parquet row per draft slot."""

from __future__ import annotations

import functools
from typing import Annotated

import typer
from rich.console import Console

from avkit.cli.options import (
    DeviceOption, DraftOption, DrafterOption, DtypeOption, EngineOption, KernelsOption, PayoffOption, TargetOption,
    VllmPythonOption, result_table, stdout_console)
from avkit.config import EngineConfig, ModelsConfig, RecordConfig, SamplingConfig, default_of
from avkit.scheduling.spec import parse_spec
from avkit.workloads import WORKLOADS, load_workload


_d = functools.partial(default_of, RecordConfig)  # an option's default: its config field's


def check_datasets(datasets: tuple[str, ...]) -> None:
    """Fail before loading models: every dataset is a known workload or a JSONL file, and it loads."""
    for name in datasets:
        load_workload(name, 1)  # an unknown name, a missing package or a bad file fails here


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
    def record(
        target: TargetOption = _d("models.target"),
        draft: DraftOption = _d("models.draft"),
        dataset: Annotated[list[str] | None, typer.Option(
            "--dataset", help=f"a workload (docs/workloads.md: {', '.join(WORKLOADS)}) or FILE.jsonl (repeatable)")] =
            None,
        num_prompts: Annotated[int, typer.Option(help="prompts per dataset")] = _d("num_prompts"),
        max_new_tokens: Annotated[int, typer.Option(help="tokens generated per request at most")] =
            _d("sampling.max_new_tokens"),
        max_prompt_tokens: Annotated[int, typer.Option(help="skip prompts longer than this")] =
            _d("max_prompt_tokens"),
        k: Annotated[int, typer.Option("-k", "--k", help="draft tokens per step")] = _d("decoding.k"),
        temperature: Annotated[float, typer.Option(help="sampling temperature (0 = greedy)")] = _d("sampling.temperature"),
        top_p: Annotated[float, typer.Option(help="top-p of target and draft sampling")] = _d("sampling.top_p"),
        concurrency: Annotated[int, typer.Option(help="requests decoding at once")] = _d("decoding.concurrency"),
        seed: Annotated[int, typer.Option(help="prompt order and sampling seed")] = _d("decoding.seed"),
        out: Annotated[str, typer.Option(help="trace file (.parquet); generations go beside it")] = _d("out"),
        resume: Annotated[bool, typer.Option(help="continue OUT: skip finished requests (refused when OUT was "
                                                 "recorded with another K, temperature, top-p, drafter or "
                                                 "model)")] = _d("resume"),
        overwrite: Annotated[bool, typer.Option(help="replace an existing OUT; the old files stay until the "
                                                     "new run finishes")] = _d("overwrite"),
        slots_per_dataset: Annotated[int, typer.Option(
            help="stop admitting a dataset after this many labelled slots (0 = off)")] = _d("slots_per_dataset"),
        flush_interval: Annotated[float, typer.Option(help="seconds between flushes to disk")] =
            _d("flush_interval"),
        device: DeviceOption = _d("models.device"),
        dtype: DtypeOption = _d("models.dtype"),
        kernels: KernelsOption = _d("decoding.kernels"),
        threads: Annotated[int, typer.Option(help="torch threads (0 = default; 1 on a busy CPU)")] = _d("threads"),
        drafter: DrafterOption = _d("models.drafter"),
        payoff: PayoffOption = _d("models.payoff"),
        engine: EngineOption = _d("engine"),
        vllm_python: VllmPythonOption = _d("vllm_python"),
        vllm_draft_sampling: Annotated[str, typer.Option(help="--engine vllm, T > 0: probabilistic (draw drafts "
                                                              "from q) | greedy (argmax drafts)")] =
            _d("vllm_draft_sampling"),
        policy: Annotated[str, typer.Option(help="verify policy: full, fixed:K, adaptive[-stop][-nogate]:ESTIMATOR, "
                                                 "schedule:FILE (avkit tune --out); trimmed slots are recorded "
                                                 "unverified (censored)")] = _d("policy"),
        cost: Annotated[str, typer.Option(help="adaptive policies: cost table JSON (avkit profile) or "
                                               "roofline:GPU:TARGET (default: the profiled table, else the CPU "
                                               "roofline)")] = _d("cost"),
        coefficients: Annotated[str, typer.Option(help="adaptive policies: coefficients.json warm start of the "
                                                       "estimator (default: vLLM's reference constants)")] =
            _d("coefficients"),
        progress: Annotated[bool, typer.Option(help="show the progress bar")] = True,
    ):
        """Record acceptance traces: one row per draft slot, streamed to Parquet in row groups."""
        config = RecordConfig(
            models=ModelsConfig(target=target, draft=draft, drafter=drafter, payoff=payoff, device=device,
                                dtype=dtype),
            decoding=EngineConfig(k=k, concurrency=concurrency, seed=seed, kernels=kernels),
            sampling=SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens),
            dataset=tuple(dataset) if dataset else _d("dataset"), num_prompts=num_prompts,
            max_prompt_tokens=max_prompt_tokens, out=out, resume=resume, overwrite=overwrite,
            slots_per_dataset=slots_per_dataset, flush_interval=flush_interval, threads=threads,
            engine=engine, vllm_python=vllm_python, vllm_draft_sampling=vllm_draft_sampling, policy=policy,
            cost=cost, coefficients=coefficients)
        parse_spec(config.policy)  # a bad --policy fails here, before torch loads (verify_policy builds it below)
        from avkit.record import record as run  # lazy: start-up (the library loads when the command runs: -h stays fast)
        from avkit.record.files import preflight  # lazy: start-up (the library loads when the command runs: -h stays fast)
        from avkit.record.recorder import verify_policy  # lazy: torch (the policy it builds)

        check_datasets(config.dataset)
        preflight(config)  # --out and --resume checks, before the banner and the models
        verify_policy(config)  # --policy and --cost too
        console = Console(stderr=True)
        console.print(f"avkit record: {config.models.target} + {config.models.draft or 'no draft'}, "
                      f"datasets {', '.join(config.dataset)} -> {config.out}")
        result = run(config, progress=progress, console=console)
        render(result, stdout_console())  # the result: stdout
        if not result.committed:
            console.print(f"[yellow]interrupted:[/] {result.trace_path} was left as it was; the rows recorded so "
                          f"far are in {result.trace_path}.partial (and its generations); rerun with --resume "
                          "to continue them")
            raise typer.Exit(130)
        if result.interrupted:
            console.print("[yellow]interrupted:[/] files hold everything recorded so far; rerun with --resume")
            raise typer.Exit(130)
