"""Write the fit outputs atomically, through `avkit.staged.StagedOutputs` (all renamed at the end, or none).

  coefficients.json  the deployable estimator (schema_version 1), read by `serve`
  scores.json        rows {feature, lossless, estimator, scope, auc, log_loss, ece, n}
  trajectory.parquet slope and intercepts after every online refit (or batch iteration); `file` is
                     the index of the trace the round came from (engine steps restart per trace)
JSON has no NaN: undefined metrics (AUC of a one-class scope) are written as null.
"""

from __future__ import annotations

import json
from pathlib import Path

from avkit.errors import ConfigError
from avkit.fit.plan import FitResult
from avkit.jsonsafe import json_safe
from avkit.staged import StagedOutputs

FILES = ("coefficients.json", "scores.json", "trajectory.parquet")


def reserve_fit_outputs(out_dir, outputs: StagedOutputs, name: str = "--out") -> dict[str, Path]:
    """Reserve the three outputs in `out_dir` (checked writable now); -> name -> temp path."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
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
    tmp["coefficients.json"].write_text(json.dumps(json_safe(result.coefficients), indent=2, allow_nan=False) + "\n")
    tmp["scores.json"].write_text(json.dumps(json_safe(result.scores), indent=1, allow_nan=False) + "\n")
    result.trajectory.write_parquet(tmp["trajectory.parquet"], compression="zstd")
    return {name: Path(out_dir).expanduser() / name for name in FILES}


__all__ = ["FILES", "reserve_fit_outputs", "write_fit_outputs"]
