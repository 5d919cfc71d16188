"""Write the fit outputs atomically, through `avkit.staged.StagedOutputs` (all renamed at the end, or none).

  coefficients.json  the deployable estimator (schema_version 1), read by `serve`
  scores.json        rows {feature, lossless, estimator, scope, auc, log_loss, ece, n}
  trajectory.parquet slope and intercepts after every online refit (or batch iteration)
JSON has no NaN: undefined metrics (AUC of a one-class scope) are written as null.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from avkit.fit.run import FitResult
from avkit.staged import StagedOutputs

FILES = ("coefficients.json", "scores.json", "trajectory.parquet")


def _no_nan(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_no_nan(v) for v in x]
    return x


def reserve_fit_outputs(out_dir, outputs: StagedOutputs, name: str = "--out") -> dict[str, Path]:
    """Reserve the three outputs in `out_dir` (checked writable now); -> name -> temp path."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        from avkit.errors import ConfigError

        raise ConfigError(f"{name} {out}: exists and is not a directory")
    return {f: outputs.file(out / f, name) for f in FILES}


def write_fit_outputs(out_dir, result: FitResult, outputs: StagedOutputs | None = None) -> dict[str, Path]:
    """Write the three outputs into `out_dir` (created if needed); -> name -> final path.

    With `outputs` the files are only staged (the caller commits them with its other outputs);
    without, they are committed here.
    """
    if outputs is None:
        with StagedOutputs() as own:
            return write_fit_outputs(out_dir, result, own)
    tmp = reserve_fit_outputs(out_dir, outputs)
    tmp["coefficients.json"].write_text(json.dumps(_no_nan(result.coefficients), indent=2) + "\n")
    tmp["scores.json"].write_text(json.dumps(_no_nan(result.scores), indent=1) + "\n")
    result.trajectory.write_parquet(tmp["trajectory.parquet"], compression="zstd")
    return {name: Path(out_dir).expanduser() / name for name in FILES}


__all__ = ["FILES", "reserve_fit_outputs", "write_fit_outputs"]
