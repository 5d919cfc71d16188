"""Benchmark `avkit fit` on synthetic traces (bench/README.md: usage; a real Ray cluster).

Default: 5M draft slots, avkit against statsmodels GLM(Binomial) and sklearn's metrics on the same data
(fit, auc, log_loss, the full score table, the online replay vs the live loop, the whole `avkit fit`), ratios
peer / avkit (> 1: avkit faster) -> bench/results/fit.json. `--scale`: `avkit fit --mode batch` per engine and
size on replica shards, each in a fresh child process -> fit_scale.{json,md}; `--generate DIR` draws those
traces beforehand (bench/fit_scale.py).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import sklearn.metrics as skm
import statsmodels.api as sm

from avkit.config import EstimatorConfig, FitConfig, SyntheticConfig
from avkit.estimators import make_estimator
from avkit.fit import run_fit, write_fit_outputs
from avkit.fit.data import load_fit_data
from avkit.fit.replay import online_replay
from avkit.metrics import auc, log_loss, score_table
from avkit.trace.synthetic import write_synthetic_trace
from common import RESULTS, csv, write  # bench/ is on sys.path when run as a script
from fit_scale import generate, run_scale

_NONE = (float("nan"), float("nan"))  # no peer for this task


def _time(fn, repeats: int) -> tuple[tuple[float, float], object]:
    """-> ((median wall s, median CPU s of this process, all threads), last result)."""
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return (statistics.median(walls), statistics.median(cpus)), out


def _peers(data, repeats: int) -> dict[str, tuple[float, float]]:
    """name -> ((avkit wall, cpu), (peer wall, cpu)) for the fit and the single metrics."""
    f, pos, y = data.features["logit_qmax"], data.positions, data.labels

    def avkit_fit():
        est = make_estimator("batch_logistic", k=data.k, config=EstimatorConfig(ridge=0.0))
        est.fit(f, pos, y, tol=1e-10)
        return est

    def glm_fit():
        design = np.column_stack([f, np.eye(data.k)[pos]])  # [N, 1 + K]
        return sm.GLM(y, design, family=sm.families.Binomial()).fit(tol=1e-10)

    t_fit, est = _time(avkit_fit, repeats)
    t_glm, glm = _time(glm_fit, 1)
    gap = float(np.abs(est.coefficients() - glm.params).max())
    p = est.predict(f, pos)
    t_auc, a = _time(lambda: auc(y, p), repeats)
    t_sk_auc, a_sk = _time(lambda: skm.roc_auc_score(y, p), repeats)
    t_ll, _ = _time(lambda: log_loss(y, p), repeats)
    t_sk_ll, _ = _time(lambda: skm.log_loss(y, p), repeats)
    t_table, _ = _time(lambda: score_table(y, p, pos, data.dataset_codes, data.dataset_names), repeats)
    print(f"parity: max |coef - statsmodels| = {gap:.2e}, |auc - sklearn| = {abs(a - a_sk):.2e}")
    return {"fit (1 feature)": (t_fit, t_glm), "auc": (t_auc, t_sk_auc), "log_loss": (t_ll, t_sk_ll),
            "score table (11 scopes)": (t_table, _NONE)}


def _online(data, repeats: int) -> dict[str, tuple[float, float]]:
    """Online replay of each online estimator (one predict + one update per refit round,
    estimators/rounds.py) vs the live loop on the same data (one predict + one update per engine step)."""
    f, pos, y = data.features["logit_qmax"], data.positions, data.labels
    bounds = data.step_bounds

    def live_loop(name):
        est = make_estimator(name, k=data.k)
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            p = est.predict(f[lo:hi], pos[lo:hi])
            est.update(f[lo:hi], pos[lo:hi], p, y[lo:hi])
        return est

    out = {}
    for name in ("online_logistic", "forgetting_logistic"):
        t_replay, (_, rows) = _time(lambda name=name: online_replay(make_estimator(name, k=data.k), data, f), repeats)
        t_live, est = _time(lambda name=name: live_loop(name), 1)
        print(f"{name}: {len(rows)} refits over {data.step_file.size:,} engine steps; live loop agrees: "
              f"{est.rounds == len(rows)}")
        out[f"online replay {name}"] = (t_replay, t_live)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=5_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "fit.json"))
    ap.add_argument("--scale", action="store_true", help="engines x sizes instead (bench/README.md)")
    ap.add_argument("--sizes", default="5000000,50000000,200000000", type=csv(int), help="--scale: slots per trace")
    ap.add_argument("--engines", default="memory,deployed,streaming,ray", type=csv(),
                    help="--scale: engines to run (deployed: memory with --features logit_qmax)")
    ap.add_argument("--scratch", default=tempfile.gettempdir(), help="--scale: where traces and spills go")
    ap.add_argument("--budget-mb", type=int, default=1536, help="--scale: memory budget of the out-of-core engines")
    ap.add_argument("--traces", default=None, help="--scale: use (and keep) DIR/synthetic-{slots}/ (replica shards)")
    ap.add_argument("--generate", default=None, metavar="DIR", help="draw DIR/synthetic-{slots}/ (replica shards) for --sizes")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    sizes = args.sizes
    if args.generate:
        for slots in sizes:
            generate(slots, str(Path(args.generate) / f"synthetic-{slots}"))
        return
    if args.scale:
        run_scale(sizes, args.engines, args.scratch, args.budget_mb, RESULTS / "fit_scale", args.traces)
        return

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        trace = write_synthetic_trace(Path(tmp) / "bench.parquet", SyntheticConfig(num_slots=args.slots, seed=0))
        print(f"synthetic trace: {args.slots:,} slots in {time.perf_counter() - t0:.1f} s")
        t_load, data = _time(lambda: load_fit_data([trace]), 1)
        print(f"observed slots: {len(data.labels):,} (read + check + order: {t_load[0]:.2f} s wall, "
              f"{t_load[1]:.2f} s CPU)")
        results = _peers(data, args.repeats)
        results.update(_online(data, args.repeats))
        t_e2e, _ = _time(lambda: write_fit_outputs(Path(tmp) / "out", run_fit([trace], FitConfig())), 1)
        results["e2e fit --mode online, 2 threads"] = (t_e2e, _NONE)
        for workers in (1, 2):
            cfg = FitConfig(mode="batch", workers=workers)
            t_e2e, _ = _time(lambda cfg=cfg: write_fit_outputs(Path(tmp) / "out", run_fit([trace], cfg)), 1)
            results[f"e2e fit --mode batch, {workers} thread(s)"] = (t_e2e, _NONE)

    print(f"\n{'task':38s} {'avkit wall':>10s} {'cpu':>7s} {'peer wall':>10s} {'cpu':>7s} {'ratio wall':>10s} "
          f"{'cpu':>6s}")
    for name, ((ours, ours_cpu), (peer, peer_cpu)) in results.items():
        print(f"{name:38s} {ours:10.3f} {ours_cpu:7.3f} {peer:10.3f} {peer_cpu:7.3f} {peer / ours:9.1f}x "
              f"{peer_cpu / ours_cpu:5.1f}x")
    print(f"(peers: statsmodels GLM, sklearn roc_auc_score / log_loss, the live per-step loop; {os.cpu_count()} CPUs, "
          f"1-min load average {os.getloadavg()[0]:.1f}: wall times grow with load, CPU times do not)")
    doc = {"slots": args.slots, "observed": len(data.labels), "cpus": os.cpu_count(),
           "load_avg_1m": os.getloadavg()[0], "python": platform.python_version(),
           "results": {k: {"avkit_wall_s": a[0], "avkit_cpu_s": a[1],
                           "peer_wall_s": None if math.isnan(b[0]) else b[0],
                           "peer_cpu_s": None if math.isnan(b[1]) else b[1]} for k, (a, b) in results.items()}}
    write({Path(args.out): doc})


if __name__ == "__main__":
    main()
