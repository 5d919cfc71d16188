"""The fit library behind `avkit fit`: one fit over trace shards, what it runs, returns and writes
(run.py), the observed slots in memory (data.py) replayed online or in batch (replay.py), or
summed out of core pass by pass (spill.py, streaming.py), the map on threads or Ray (engines.py)."""

from avkit.fit.run import FitResult, reserve_fit_outputs, run_fit, write_fit_outputs

__all__ = ["FitResult", "reserve_fit_outputs", "run_fit", "write_fit_outputs"]
