"""`avkit simulate`: replay traces under verify policies across concurrency against a cost model."""

from __future__ import annotations

import functools
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from avkit.cli.options import ConcurrencyOption, CostOption, TracesArgument, parse_ints, stdout_console
from avkit.config import SimulateConfig, default_of
from avkit.errors import ConfigError
from avkit.scheduling.spec import parse_spec
from avkit.staged import StagedOutputs


_d = functools.partial(default_of, SimulateConfig)  # an option's default: its config field's


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate(
        traces: TracesArgument = None,
        cost: CostOption = _d("cost"),
        concurrency: ConcurrencyOption = ",".join(map(str, _d("concurrency"))),
        policy: Annotated[list[str] | None, typer.Option(
            "--policy", help="repeatable (or comma-separated): nospec, fixed, fixed:K, adaptive:ESTIMATOR, "
            "adaptive:oracle, adaptive:recorded, adaptive-stop:ESTIMATOR (also stops drafting early), "
            "adaptive[-stop]-nogate:... (no draft gate), schedule:FILE, full (default: all but -nogate "
            "and schedule)", show_default=False)] = None,
        coefficients: Annotated[str, typer.Option(help="coefficients.json warm start for adaptive estimators")] =
            _d("coefficients"),
        waves: Annotated[int, typer.Option(help="requests served per lane at least (recorded ones are cycled)")] =
            _d("waves"),
        out: Annotated[str, typer.Option(help="results Parquet (one row per concurrency x policy)")] = _d("out"),
        step_time: Annotated[bool, typer.Option("--step-time", help="compare predicted with recorded step times")] =
            _d("step_time"),
        profile: Annotated[str, typer.Option(help="replay an aggregate acceptance profile (`avkit import "
                                                  "vllm-metrics`) instead of traces: nospec and fixed K only")] =
            _d("profile"),
    ):
        """Replay traces: no-spec, every fixed K, adaptive per estimator and the oracle, per concurrency."""

        config = SimulateConfig(concurrency=parse_ints("concurrency", concurrency), cost=cost, out=out, waves=waves,
                                coefficients=coefficients, step_time=step_time, profile=profile)
        given = [s.strip() for p in policy for s in p.split(",") if s.strip()] if policy else None
        for text in given or ():
            parse_spec(text, bare=("fixed",))  # a bad --policy fails here, before torch loads
        from avkit.scheduling.cost import resolve_cost  # lazy: start-up
        from avkit.sim.drive import parse_policies  # lazy: start-up
        from avkit.sim.replay import (  # lazy: start-up
            default_policies, load_steps, results_inputs, simulate as run, step_time_check, write_results)
        from avkit.sim.terminal import render_results  # lazy: start-up
        from avkit.trace.reader import common_k  # lazy: start-up
        from avkit.trace.shards import check_shards, shipped_traces  # lazy: start-up
        table = resolve_cost(config.cost)
        if profile and traces:
            raise ConfigError("--profile replaces TRACE: an aggregate is never mixed with per-draft rows")
        paths = [profile] if profile else [str(p) for p in (check_shards(traces).paths if traces else shipped_traces())]
        console = Console(stderr=True)
        with StagedOutputs() as outputs:
            outputs.file(config.out, "--out")  # an unwritable --out fails now, not after the replay
            if profile:
                from avkit.sim.steps import policies_for_profile, profile_steps, read_profile  # lazy: start-up

                steps = profile_steps(read_profile(profile))
                specs = policies_for_profile(given, steps.k)
                console.print(f"avkit simulate: AGGREGATE acceptance profile {profile} (no per-draft rows)")
            else:
                steps = load_steps(paths)
                if note := common_k(paths)[1]:
                    console.print(f"avkit simulate: {note}", soft_wrap=True)
                specs = given or default_policies(steps, config)
            n_policies = len(parse_policies(specs, steps.k, coefficients))  # validates before the long part
            console.print(f"avkit simulate: {len(paths)} input file(s), {steps.request.size} steps of "
                          f"{steps.num_requests} requests, K={steps.k}; cost {table.meta.get('source', '')} "
                          f"{table.meta.get('device', '')} {table.meta.get('target', '')}")
            with Progress(console=console, transient=True) as bar:
                task = bar.add_task("simulating", total=n_policies * len(config.concurrency))
                df = run(steps, table, config.concurrency, specs, config=config, coefficients=coefficients,
                         progress=lambda: bar.advance(task))
            stdout = stdout_console()  # results; progress and logs on stderr
            render_results(df, stdout, f"throughput, tokens/s (× best fixed K); cost {config.cost}")
            path = write_results(df, config.out, outputs, inputs=results_inputs(paths, table, config, specs))
            check = step_time_check(steps, table) if step_time else None
        console.print(f"results: {path}")
        if check is not None:
            for label, c in (("all steps", check), ("decode-only steps", check["decode_only"])):
                stdout.print(f"step time ({label}): predicted/recorded median {c['median_ratio']:.3f}, "
                              f"median |error| {100 * c['median_abs_rel_error']:.1f}% over "
                              f"{c['engine_steps']} engine steps")
