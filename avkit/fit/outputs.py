"""Write the fit outputs atomically: every file is written to a temp name, then all are renamed.

  coefficients.json  the deployable estimator (schema_version 1), read by `serve`
  scores.json        rows {feature, lossless, estimator, scope, auc, log_loss, ece, n}
  trajectory.parquet slope and intercepts after every online refit (or batch iteration)
JSON has no NaN: undefined metrics (AUC of a one-class scope) are written as null.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from avkit.fit.run import FitResult

FILES = ("coefficients.json", "scores.json", "trajectory.parquet")


def _no_nan(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_no_nan(v) for v in x]
    return x


def write_fit_outputs(out_dir, result: FitResult) -> dict[str, Path]:
    """Write the three outputs into `out_dir` (created if needed); -> name -> final path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = {name: out / f".{name}.{os.getpid()}.tmp" for name in FILES}
    try:
        tmp["coefficients.json"].write_text(json.dumps(_no_nan(result.coefficients), indent=2) + "\n")
        tmp["scores.json"].write_text(json.dumps(_no_nan(result.scores), indent=1) + "\n")
        result.trajectory.write_parquet(tmp["trajectory.parquet"], compression="zstd")
    except BaseException:
        for p in tmp.values():
            p.unlink(missing_ok=True)
        raise
    for name, p in tmp.items():
        os.replace(p, out / name)
    return {name: out / name for name in FILES}


__all__ = ["FILES", "write_fit_outputs"]
