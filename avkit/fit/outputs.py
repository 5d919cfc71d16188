"""Write the fit outputs atomically: every file is written to a temp name, then all are renamed.

  coefficients.json  the deployable estimator (schema_version 1), read by `serve`
  scores.json        rows {feature, lossless, estimator, scope, auc, log_loss, ece, n}
  trajectory.parquet slope and intercepts after every online refit (or batch iteration); `file` is
                     the index of the trace the round came from (engine steps restart per trace)
JSON has no NaN: undefined metrics (AUC of a one-class scope) are written as null.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from avkit.fit.run import FitResult
from avkit.jsonsafe import json_safe

FILES = ("coefficients.json", "scores.json", "trajectory.parquet")


def write_fit_outputs(out_dir, result: FitResult) -> dict[str, Path]:
    """Write the three outputs into `out_dir` (created if needed); -> name -> final path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = {name: out / f".{name}.{os.getpid()}.tmp" for name in FILES}
    try:
        tmp["coefficients.json"].write_text(json.dumps(json_safe(result.coefficients), indent=2, allow_nan=False) + "\n")
        tmp["scores.json"].write_text(json.dumps(json_safe(result.scores), indent=1, allow_nan=False) + "\n")
        result.trajectory.write_parquet(tmp["trajectory.parquet"], compression="zstd")
    except BaseException:
        for p in tmp.values():
            p.unlink(missing_ok=True)
        raise
    for name, p in tmp.items():
        os.replace(p, out / name)
    return {name: out / name for name in FILES}


__all__ = ["FILES", "write_fit_outputs"]
