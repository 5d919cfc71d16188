"""Report sections, one content block per module, in reading order.

Each module has `build(inputs: ReportInputs) -> Section`; a section whose
inputs are missing returns `Section(..., omitted="why, and how to add it")` instead of failing.
"""

from collections.abc import Callable

from avkit.report.sections import features, hybrid, online, reliability, simulation, summary, tune

# section key (its module's name) -> its builder, in reading order
SECTIONS: dict[str, Callable] = {m.__name__.rpartition(".")[2]: m.build
                                 for m in (summary, features, reliability, online, simulation, tune, hybrid)}

__all__ = ["SECTIONS"]
