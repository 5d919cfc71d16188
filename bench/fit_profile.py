"""`bench/fit.py --profile DIR`: where the in-memory batch fit's time goes, step by step, against a
baseline checkout in the same run.

Each checkout runs in its own child process (PYTHONPATH = that checkout), interleaved, on the same
trace set DIR (replica shards): first the steps of `avkit fit --mode batch` on one thread, each
timed in CPU seconds (`time.process_time`, so the load of a shared box inflates them little):
read + check + order (`load_fit_data`), the score layout, the position grouping, then the fit and
the score table of every (feature, estimator); then the whole `run_fit` on `--workers` threads
(wall and CPU), and the batch fit a fleet deploys: `--features logit_qmax` (read + check + fit +
score of the one written feature), where the checkout has the option. Prints one table (baseline s,
this s, ratio); nothing is written. A benchmark, never a pass/fail test.

    python bench/fit.py --profile /work/wip/fleet/synthetic-5000000 [--baseline /work/main] [--repeats 1]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_steps(trace: str, workers: int) -> None:
    """Print one JSON line: {step: CPU s} of the batch fit's steps, then the whole run_fit."""
    from avkit.config import EstimatorConfig, FitConfig
    from avkit.fit.data import load_fit_data
    from avkit.fit.run import _fit_one, plan_features, run_fit
    from avkit.metrics.table import ScoreLayout
    from avkit.trace.shards import check_shards

    out: dict[str, float] = {}

    def step(name, fn):
        c = time.process_time()
        r = fn()
        out[name] = out.get(name, 0.0) + time.process_time() - c
        return r

    paths = check_shards([trace]).paths
    fit, est = FitConfig(mode="batch", workers=1), EstimatorConfig()
    data = step("read + check + order", lambda: load_fit_data(paths))
    layout = step("score layout", lambda: ScoreLayout(data.labels, data.positions, data.dataset_codes,
                                                      data.dataset_names, fit.n_bins))
    step("position grouping", lambda: data.position_order)
    for name, e in plan_features(fit, est, data.features):
        _, preds, _ = step(f"fit ({'no fit' if e in ('qmax', 'passthrough') else e})",
                           lambda name=name, e=e: _fit_one(name, e, data, fit, est, None))
        step("score tables", lambda preds=preds: layout.score(preds))
    out["observed"] = float(len(data.labels))
    data = layout = None  # free them before the whole run
    w, c = time.perf_counter(), time.process_time()
    run_fit(paths, FitConfig(mode="batch", workers=workers))
    out[f"run_fit wall, {workers} threads"] = time.perf_counter() - w
    out[f"run_fit CPU, {workers} threads"] = time.process_time() - c
    if "features" in FitConfig.__dataclass_fields__:  # the deployed fit: one feature
        w, c = time.perf_counter(), time.process_time()
        run_fit(paths, FitConfig(mode="batch", workers=workers, features=("logit_qmax",)))
        out[f"--features logit_qmax wall, {workers} thr"] = time.perf_counter() - w
        out[f"--features logit_qmax CPU, {workers} thr"] = time.process_time() - c
    print(json.dumps(out))


def _child(root: Path, trace: str, workers: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    res = subprocess.run([sys.executable, __file__, "--child-steps", trace, str(workers)], env=env,
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{root}: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_profile(trace: str, baseline: str | None, repeats: int = 1, workers: int = 2) -> None:
    import pyarrow.parquet as pq

    from avkit.trace.shards import check_shards

    runs: dict[str, list[dict]] = {"this": [], "baseline": []}
    for _ in range(repeats):  # interleaved: the box's load drifts alike for both
        runs["this"].append(_child(ROOT, trace, workers))
        if baseline:
            runs["baseline"].append(_child(Path(baseline), trace, workers))
    best = {k: {s: min(r[s] for r in v) for s in v[0]} for k, v in runs.items() if v}
    slots = sum(pq.ParquetFile(p).metadata.num_rows for p in check_shards([trace]).paths)
    this, base = best["this"], best.get("baseline", {})
    print(f"{trace}: {slots:,} slots, {this.pop('observed'):,.0f} observed; CPU s (min of {repeats}), "
          f"1-min load {os.getloadavg()[0]:.1f}")
    base.pop("observed", None)
    print(f"{'step':34s} {'baseline':>9s} {'this':>9s} {'ratio':>6s}")
    for s, v in this.items():
        b = base.get(s, float("nan"))
        print(f"{s:34s} {b:9.3f} {v:9.3f} {b / v if v else float('nan'):5.2f}x")
    for s, v in this.items():
        if s.startswith(("run_fit CPU", "--features logit_qmax CPU")):
            print(f"{s}: {slots / v / 1e6:.2f}M slots per CPU-second")


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--child-steps":
    child_steps(sys.argv[2], int(sys.argv[3]))
