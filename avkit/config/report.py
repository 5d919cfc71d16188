"""`avkit report`: which results it reads and how it draws them."""

from __future__ import annotations

from dataclasses import dataclass

from avkit.config.fit import FitConfig
from avkit.validate import in_range, one_of


@dataclass(frozen=True)
class ReportConfig:
    """`avkit report`: HTML + Markdown + PNG from a fit directory, simulation and HVD results.

    `sim` and `hvd` are read when the files exist (the default outputs of `avkit simulate` and
    `avkit hvd`); a missing input omits its section with a note, never an error.
    """

    out: str = "reports/report"
    sim: str = "reports/simulate.parquet"  # `avkit simulate` results (one row per concurrency x policy)
    hvd: str = "reports/hvd/hvd_metrics.json"  # `avkit hvd` results
    tune: str = "reports/tune.json"  # `avkit tune` results (its section is left out when absent)
    bins: int = 10  # reliability-diagram bins (equal-width in predicted probability, as the fit's ECE)
    dpi: int = 120
    embed: bool = True  # index.html carries the PNGs as data URIs (portable); they are written beside too
    engine: str = "memory"  # memory: the traces in RAM; streaming: summed out of core (report/streamed.py)
    memory_budget: int = 1536  # streaming: MB of memory to stay under, whatever the traces' size
    scratch: str | None = None  # streaming: directory for the spilled observed slots (None: system temp)

    def __post_init__(self):
        in_range(self, "bins", 2, 100)
        in_range(self, "dpi", 50, 600)
        one_of(self, "engine", ("memory", "streaming"))
        in_range(self, "memory_budget", 256)

    def streaming(self):
        """The out-of-core FitConfig of `--engine streaming` (None: in memory)."""
        return None if self.engine == "memory" else FitConfig(
            mode="batch", engine="streaming", memory_budget=self.memory_budget, scratch=self.scratch)


__all__ = ["ReportConfig"]
