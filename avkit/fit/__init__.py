"""The fit library behind `avkit fit`: what it runs, returns and writes (run.py); the observed slots in
memory (data.py), replayed online (replay.py); the batch fit over shards, held in memory or spilled
(passes.py, spill.py); the map on threads or Ray (engines.py)."""

from avkit.fit.run import FitResult, reserve_fit_outputs, run_fit, write_fit_outputs

__all__ = ["FitResult", "reserve_fit_outputs", "run_fit", "write_fit_outputs"]
