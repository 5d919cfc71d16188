"""The fit library behind `avkit fit`: one fit over trace shards (run.py), what it runs and returns
(plan.py), the observed slots in memory (data.py) replayed online or in batch (replay.py), or summed
out of core pass by pass (spill.py, streaming.py), the map on threads or Ray (engines.py), the outputs
written atomically (outputs.py)."""

from avkit.fit.outputs import write_fit_outputs
from avkit.fit.run import FitResult, run_fit

__all__ = ["FitResult", "run_fit", "write_fit_outputs"]
