"""`avkit import vllm-metrics URL|FILE`: a running vLLM's spec-decode counters -> an acceptance profile JSON."""

from __future__ import annotations

from typing import Annotated

import typer

from avkit.cli.options import result_table, stdout_console
from avkit.jsonsafe import dumps
from avkit.staged import StagedOutputs


def register(app: typer.Typer) -> None:
    sub = typer.Typer(help="Bring other engines' measurements into avkit's formats.", no_args_is_help=True)
    app.add_typer(sub, name="import")

    @sub.command("vllm-metrics")
    def vllm_metrics(
        source: Annotated[str, typer.Argument(metavar="URL|FILE", help="vLLM's /metrics URL or a saved copy")],
        out: Annotated[str, typer.Option(help="acceptance profile JSON (for `avkit simulate --profile`)")] =
            "reports/vllm_acceptance.json",
        model_name: Annotated[str, typer.Option(help="the model_name label to read when vLLM serves several")] = "",
    ):
        """Per-position acceptance (conditional and survival, 95% intervals) from vLLM's Prometheus counters.

        An AGGREGATE: no per-draft rows or features; `simulate --profile` replays it for no-spec and fixed K."""
        from avkit.engines.vllm.metrics import acceptance_profile, parse_counters, read_source  # lazy: start-up

        with StagedOutputs() as outputs:
            tmp = outputs.file(out, "--out")
            profile = acceptance_profile(parse_counters(read_source(source), source, model_name), source)
            tmp.write_text(dumps(profile, indent=1) + "\n")
        console = stdout_console()  # the result: stdout
        console.print(result_table(
            f"{source}: {profile['num_drafts']} drafts, K={profile['k']} (aggregate)",
            ("position", "reached", "accepted", "P(accept | reached) [95%]", "P(L > j)"),
            [(str(p["position"]), str(p["reached"]), str(p["accepted"]),
              f"{p['conditional']:.3f} [{p['conditional_lo']:.3f}, {p['conditional_hi']:.3f}]", f"{p['survival']:.3f}")
             for p in profile["positions"]]))
        note = "" if profile["full_drafts"] else " (some drafts had fewer than K tokens: `reached` is approximate)"
        console.print(f"per-slot acceptance {profile['per_slot_acceptance']:.3f}, mean accepted length "
                      f"{profile['mean_accepted_length']:.2f}{note}; profile: {out}")
