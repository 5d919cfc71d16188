"""`avkit simulate`: replay traces under verify policies across concurrency against a cost model."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from avkit.cli.options import arg, config_options, stdout_console, traces_arg
from avkit.config import SimulateConfig
from avkit.errors import ConfigError
from avkit.scheduling.spec import parse_spec
from avkit.staged import StagedOutputs


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    @config_options(
        SimulateConfig, traces_arg(), "cost", "concurrency",
        arg("policy", Annotated[list[str] | None, typer.Option(
            "--policy", help="repeatable (or comma-separated): nospec, fixed, fixed:K, adaptive:ESTIMATOR, "
            "adaptive:oracle, adaptive:recorded, adaptive-stop:ESTIMATOR (also stops drafting early), "
            "adaptive[-stop]-nogate:... (no draft gate), schedule:FILE, full (default: all but -nogate "
            "and schedule)", show_default=False)], None),
        "coefficients", "waves", "out", "step_time", "profile")
    def simulate(config: SimulateConfig, traces, policy):
        """Replay traces: no-spec, every fixed K, adaptive per estimator and the oracle, per concurrency."""
        given = [s.strip() for p in policy for s in p.split(",") if s.strip()] if policy else None
        for text in given or ():
            parse_spec(text, bare=("fixed",))  # a bad --policy fails here, before torch loads
        from avkit.scheduling.cost import resolve_cost  # lazy: start-up
        from avkit.sim.drive import parse_policies  # lazy: start-up
        from avkit.sim.replay import default_policies, load_steps, simulate_and_write, step_time_check  # lazy: start-up
        from avkit.sim.terminal import render_results  # lazy: start-up
        from avkit.trace.reader import common_k  # lazy: start-up
        from avkit.trace.shards import check_shards, shipped_traces  # lazy: start-up
        table = resolve_cost(config.cost)
        if config.profile and traces:
            raise ConfigError("--profile replaces TRACE: an aggregate is never mixed with per-draft rows")
        paths = [config.profile] if config.profile else [
            str(p) for p in (check_shards(traces).paths if traces else shipped_traces())]
        console = Console(stderr=True)
        with StagedOutputs() as outputs:
            outputs.file(config.out, "--out")  # an unwritable --out fails now, not after the replay
            if config.profile:
                from avkit.sim.steps import policies_for_profile, profile_steps, read_profile  # lazy: start-up

                steps = profile_steps(read_profile(config.profile))
                specs = policies_for_profile(given)
                console.print(f"avkit simulate: AGGREGATE acceptance profile {config.profile} (no per-draft rows)")
            else:
                steps = load_steps(paths)
                if note := common_k(paths)[1]:
                    console.print(f"avkit simulate: {note}", soft_wrap=True)
                specs = given or default_policies(steps, config)
            n_policies = len(parse_policies(specs, steps.k, config.coefficients))  # validates before the long part
            console.print(f"avkit simulate: {len(paths)} input file(s), {steps.request.size} steps of "
                          f"{steps.num_requests} requests, K={steps.k}; cost {table.meta.get('source', '')} "
                          f"{table.meta.get('device', '')} {table.meta.get('target', '')}")
            with Progress(console=console, transient=True) as bar:
                task = bar.add_task("simulating", total=n_policies * len(config.concurrency))
                df, path = simulate_and_write(paths, table, config, config.out, outputs, steps=steps, policies=specs,
                                              progress=lambda: bar.advance(task))
            stdout = stdout_console()  # results; progress and logs on stderr
            render_results(df, stdout, f"throughput, tokens/s (× best fixed K); cost {config.cost}")
            check = step_time_check(steps, table) if config.step_time else None
        console.print(f"results: {path}")
        if check is not None:
            for label, c in (("all steps", check), ("decode-only steps", check["decode_only"])):
                stdout.print(f"step time ({label}): predicted/recorded median {c['median_ratio']:.3f}, "
                              f"median |error| {100 * c['median_abs_rel_error']:.1f}% over "
                              f"{c['engine_steps']} engine steps")
