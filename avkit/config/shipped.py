"""The files shipped with avkit: the traces, the coefficients fitted on them and the cost table of their model pair
profiled on a 2-core CPU. Each is found under the working directory, else beside the package (a clone)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_TRACE_GLOB = "traces/*.parquet"  # the shipped traces every command uses with no TRACE argument
SHIPPED_COEFFICIENTS = "traces/coefficients.json"  # fitted on the shipped traces
# `avkit profile` of the traces' model pair on a 2-core CPU (Xeon with AMX, bfloat16, T = 1, context 512): the
# default cost model of `avkit simulate`, `tune` and `report`; a roofline (e.g. roofline:H200:8b) is a what-if
SHIPPED_COST = "traces/cost_cpu.json"


def shipped_roots() -> tuple[Path, Path]:
    """Where shipped files are looked for, in order: the working directory, then beside the package."""
    return Path.cwd(), Path(__file__).resolve().parents[2]


def shipped_file(name: str) -> Path | None:
    """The shipped file `name` (repo-relative) under the first root that has it; None when none does."""
    return next((root / name for root in shipped_roots() if (root / name).is_file()), None)


__all__ = ["DEFAULT_TRACE_GLOB", "SHIPPED_COEFFICIENTS", "SHIPPED_COST", "shipped_file", "shipped_roots"]
