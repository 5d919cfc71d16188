"""Report sections, one content block per module, in reading order.

Each module has `build(inputs: ReportInputs, config: ReportConfig) -> Section`; a section whose
inputs are missing returns `Section(..., omitted="why, and how to add it")` instead of failing.
"""

from collections.abc import Callable

from avkit.report.sections import features, hybrid, online, reliability, simulation, summary, tune

SECTIONS: dict[str, Callable] = {
    "summary": summary.build,
    "features": features.build,
    "reliability": reliability.build,
    "online": online.build,
    "simulation": simulation.build,
    "tune": tune.build,
    "hybrid": hybrid.build,
}

__all__ = ["SECTIONS"]
