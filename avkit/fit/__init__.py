"""The fit library behind `avkit fit`: load observed slots in engine-step order (data.py), replay
them through estimators online or in batch (replay.py), score every feature (run.py), write the
outputs atomically (outputs.py)."""

from avkit.fit.outputs import write_fit_outputs
from avkit.fit.run import FitResult, run_fit

__all__ = ["FitResult", "run_fit", "write_fit_outputs"]
