"""`avkit profile`: measure this device's step costs for the adaptive budget."""

from __future__ import annotations


import typer
from rich.console import Console
from rich.progress import Progress, TimeElapsedColumn

from avkit.cli.options import config_options, result_table, stdout_console
from avkit.config import ProfileConfig
from avkit.staged import StagedOutputs


def render(table, console: Console) -> None:
    ms = "{:.2f}".format
    cols = {"target tokens": (table.verify_tokens, str), "verify ms": (table.verify_ms, ms),
            "draft requests": (table.draft_requests, str), "draft ms (1 pass)": (table.draft_ms, ms)}
    if table.draft_fixed_ms:  # vLLM's drafting: a first-pass surcharge paid once per step (cost.py)
        cols["draft ms (once per step)"] = (table.draft_fixed_ms, ms)
    if table.prefill_tokens:  # the drafter's prefill of one request: a catch-up's price (scheduling/batch_schedule.py)
        cols |= {"prefill tokens": (table.prefill_tokens, str), "drafter prefill ms": (table.prefill_ms, ms)}
    n = max(len(table.verify_tokens), len(table.draft_requests), len(table.prefill_tokens))
    console.print(result_table(f"step costs on {table.meta.get('device', '?')} at context "
                               f"{table.meta.get('context_len')}", cols,
                               ([fmt(seq[i]) if i < len(seq) else "" for seq, fmt in cols.values()] for i in range(n))))


def register(app: typer.Typer) -> None:
    @app.command("profile")
    @config_options(
        ProfileConfig, "models.target", "models.draft", "out", "context_len", "k", "max_verify_tokens",
        "max_requests", "repeats", "sampling.temperature", "sampling.top_p", "models.device", "models.dtype",
        "engine", "vllm_python", "threads",
        help={"draft": "draft model ('none': verify costs only)", "top_p": "top-p of that sampling work",
              "temperature": "sampling work timed with each forward (0: argmax)"})
    def profile(config: ProfileConfig):
        """Profile verify cost by target tokens and draft cost by requests; save a monotone cost table."""
        console = Console(stderr=True)
        with StagedOutputs() as outputs:
            outputs.file(config.out, "--out")  # an unwritable --out fails now, not after minutes of profiling
            measure = _profile_vllm(config) if config.engine == "vllm" else _profile_native(config, console)
            with Progress(*Progress.get_default_columns(), TimeElapsedColumn(), console=console,
                          transient=True) as bar:
                task = bar.add_task(f"profiling{' vLLM' if config.engine == 'vllm' else ''} ({config.repeats} "
                                    f"{'steps' if config.engine == 'vllm' else 'runs'} per point)", total=measure[0])
                table = measure[1](lambda: bar.advance(task))
            render(table, stdout_console())
            console.print(noise_line(table.meta.get("noise", {})), highlight=False)
            path = table.save(config.out, outputs)
        console.print(f"cost table: {path}")


def _profile_native(config, console: Console):
    """avkit's runtime: the models loaded here -> (points, measure(on_point) -> the cost table)."""
    from avkit.models import load_pair  # lazy: start-up
    from avkit.scheduling.profile import num_points, profile_costs  # lazy: start-up

    models = config.models
    with console.status(f"avkit profile: loading {models.target}" + (f" + {models.draft}" if models.has_draft else "")):
        tgt, drf = load_pair(models)
    return num_points(config, drf is not None), lambda on_point: profile_costs(tgt, drf, config, on_point=on_point)


def _profile_vllm(config):
    """`--engine vllm`: vLLM's step costs (avkit/engines/vllm/profile.py), the same table format."""
    from avkit.engines.vllm.driver import check_vllm_version, hf_dir, vllm_python  # lazy: start-up
    from avkit.engines.vllm.profile import num_points, profile_vllm  # lazy: start-up

    python = vllm_python(config.vllm_python)
    check_vllm_version(python)
    tgt = hf_dir(config.models.target, "--target")
    drf = hf_dir(config.models.draft, "--draft") if config.k > 0 else tgt
    return num_points(config), lambda on_point: profile_vllm(python, tgt, drf, config, dtype=config.models.dtype,
                                                             threads=config.threads, on_point=on_point)


def noise_line(noise: dict) -> str:
    """How noisy the table is, in one line; a warning when repeated runs disagree or the curve went down."""
    if not noise:
        return ""
    text = (f"noise: repeated runs of a point spread by {100 * noise['median_spread']:.1f}% IQR / median (median "
            f"over points; worst {100 * noise['max_spread']:.1f}% at {noise['worst']})")
    moved = noise.get("moved", [])
    if moved:
        worst = max(moved, key=lambda x: abs(x[2]))
        text += (f"; the monotone (isotonic) fit moved {len(moved)} point(s) off their measurement, up to "
                 f"{100 * worst[2]:+.1f}% at {worst[0]}={worst[1]} (the measured curve went down there)")
    if noise.get("noisy"):
        return (f"[bold yellow]warning:[/] {text}. The table is noisy: rerun on an idle machine or with more "
                "--repeats.")
    return text + "."
