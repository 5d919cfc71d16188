"""`avkit report`: which results it reads and how it draws them."""

from __future__ import annotations

from dataclasses import dataclass

from avkit.config.fields import checked
from avkit.config.fit import FitConfig, OutOfCoreConfig


@dataclass(frozen=True)
class ReportConfig(OutOfCoreConfig):
    """`avkit report`: HTML + Markdown + PNG from a fit directory, simulation and HVD results.

    `sim` and `hvd` are read when the files exist (the default outputs of `avkit simulate` and
    `avkit hvd`); a missing input omits its section with a note, never an error. `memory_budget` and
    `scratch` are those of `--engine streaming`.
    """

    out: str = "reports/report"
    sim: str = "reports/simulate.parquet"  # `avkit simulate` results (one row per concurrency x policy)
    hvd: str = "reports/hvd/hvd_metrics.json"  # `avkit hvd` results
    tune: str = "reports/tune.json"  # `avkit tune` results (its section is left out when absent)
    # reliability-diagram bins (equal-width in predicted probability, as the fit's ECE)
    bins: int = checked(10, 2, 100)
    dpi: int = checked(120, 50, 600)
    embed: bool = True  # index.html carries the PNGs as data URIs (portable); they are written beside too
    # memory: the traces in RAM; streaming: summed out of core (report/traces.py)
    engine: str = checked("memory", choices=("memory", "streaming"))

    def streaming(self):
        """The out-of-core FitConfig of `--engine streaming` (None: in memory)."""
        return None if self.engine == "memory" else FitConfig(
            mode="batch", engine="streaming", memory_budget=self.memory_budget, scratch=self.scratch)


__all__ = ["ReportConfig"]
