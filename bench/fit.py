"""Benchmark `avkit fit` on synthetic traces (bench/README.md: usage; a real Ray cluster).

Default: 5M draft slots, avkit against statsmodels GLM(Binomial) and sklearn's metrics on the same data
(fit, auc, log_loss, the full score table, the online replay vs the live loop, the whole `avkit fit`), ratios
peer / avkit (> 1: avkit faster) -> bench/results/fit.json. `--scale`: `avkit fit --mode batch` per engine and
size on replica shards of at most SHARD_SLOTS, each fit in a fresh child process (this file with --child-fit;
wall, slots/s, the peak RSS of its process tree) -> fit_scale.{json,md}; `--generate DIR` draws those traces
beforehand, one child per shard drawing it chunk by chunk (--child-generate).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from avkit.markdown import md_table
from common import RESULTS, csv, write  # bench/ is on sys.path when run as a script

# lazy: the rest of avkit, sklearn, statsmodels, psutil (and ray) are imported in the functions that use them, since a
# child's peak memory is the measurement: it holds only what its own path runs

MEMORY_BYTES_PER_SLOT = 200  # in-memory fit: observed columns + features + predictions (measured: ~140 at 5M)
SHARD_SLOTS = 25_000_000  # slots per replica shard of a synthetic fleet trace (at least MIN_SHARDS shards)
MIN_SHARDS = 2


def _time(fn, repeats: int) -> tuple[tuple[float, float], object]:
    """-> ((median wall s, median CPU s of this process, all threads), last result)."""
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return (statistics.median(walls), statistics.median(cpus)), out


def _peers(data, repeats: int) -> dict[str, tuple]:
    """name -> ((avkit wall, cpu), (peer wall, cpu) or None) for the fit, the single metrics and the online
    replay of each online estimator (one predict + one update per refit round, estimators/rounds.py) vs the live
    loop on the same data (one predict + one update per engine step)."""
    import sklearn.metrics as skm
    import statsmodels.api as sm

    from avkit.config import EstimatorConfig
    from avkit.estimators import make_estimator
    from avkit.fit.replay import online_replay
    from avkit.metrics import auc, log_loss, score_table

    f, pos, y, bounds = data.features["logit_qmax"], data.positions, data.labels, data.step_bounds

    def avkit_fit():
        est = make_estimator("batch_logistic", k=data.k, config=EstimatorConfig(ridge=0.0))
        est.fit(f, pos, y, tol=1e-10)
        return est

    def glm_fit():
        design = np.column_stack([f, np.eye(data.k)[pos]])  # [N, 1 + K]
        return sm.GLM(y, design, family=sm.families.Binomial()).fit(tol=1e-10)

    def live_loop(name):
        est = make_estimator(name, k=data.k)
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            p = est.predict(f[lo:hi], pos[lo:hi])
            est.update(f[lo:hi], pos[lo:hi], p, y[lo:hi])
        return est

    t_fit, est = _time(avkit_fit, repeats)
    t_glm, glm = _time(glm_fit, 1)
    gap = float(np.abs(est.coefficients() - glm.params).max())
    p = est.predict(f, pos)
    t_auc, a = _time(lambda: auc(y, p), repeats)
    t_sk_auc, a_sk = _time(lambda: skm.roc_auc_score(y, p), repeats)
    print(f"parity: max |coef - statsmodels| = {gap:.2e}, |auc - sklearn| = {abs(a - a_sk):.2e}")
    out = {"fit (1 feature)": (t_fit, t_glm), "auc": (t_auc, t_sk_auc),
           "log_loss": (_time(lambda: log_loss(y, p), repeats)[0], _time(lambda: skm.log_loss(y, p), repeats)[0]),
           "score table (11 scopes)": (_time(lambda: score_table(y, p, pos, data.dataset_codes, data.dataset_names),
                                             repeats)[0], None)}
    for name in ("online_logistic", "forgetting_logistic"):
        t_replay, (_, rows) = _time(lambda name=name: online_replay(make_estimator(name, k=data.k), data, f), repeats)
        t_live, est = _time(lambda name=name: live_loop(name), 1)
        print(f"{name}: {len(rows)} refits over {data.step_file.size:,} engine steps; live loop agrees: "
              f"{est.rounds == len(rows)}")
        out[f"online replay {name}"] = (t_replay, t_live)
    return out


def bench(args) -> None:
    """The default run: avkit against its peers on one synthetic trace -> --out (fit.json)."""
    from avkit.config import FitConfig, SyntheticConfig
    from avkit.fit import run_fit, write_fit_outputs
    from avkit.fit.data import load_fit_data
    from avkit.trace.synthetic import write_synthetic_trace

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        trace = write_synthetic_trace(Path(tmp) / "bench.parquet", SyntheticConfig(num_slots=args.slots, seed=0))
        print(f"synthetic trace: {args.slots:,} slots in {time.perf_counter() - t0:.1f} s")
        t_load, data = _time(lambda: load_fit_data([trace]), 1)
        print(f"observed slots: {len(data.labels):,} (read + check + order: {t_load[0]:.2f} s wall, "
              f"{t_load[1]:.2f} s CPU)")
        results = _peers(data, args.repeats)
        results["e2e fit --mode online, 2 threads"] = (
            _time(lambda: write_fit_outputs(Path(tmp) / "out", run_fit([trace], FitConfig())), 1)[0], None)
        for workers in (1, 2):
            cfg = FitConfig(mode="batch", workers=workers)
            t_e2e, _ = _time(lambda cfg=cfg: write_fit_outputs(Path(tmp) / "out", run_fit([trace], cfg)), 1)
            results[f"e2e fit --mode batch, {workers} thread(s)"] = (t_e2e, None)

    print(f"\n{'task':38s} {'avkit wall':>10s} {'cpu':>7s} {'peer wall':>10s} {'cpu':>7s} {'ratio wall':>10s} "
          f"{'cpu':>6s}")
    for name, ((ours, ours_cpu), peer) in results.items():
        peer, peer_cpu = peer or (float("nan"), float("nan"))
        print(f"{name:38s} {ours:10.3f} {ours_cpu:7.3f} {peer:10.3f} {peer_cpu:7.3f} {peer / ours:9.1f}x "
              f"{peer_cpu / ours_cpu:5.1f}x")
    print(f"(peers: statsmodels GLM, sklearn roc_auc_score / log_loss, the live per-step loop; {os.cpu_count()} CPUs, "
          f"1-min load average {os.getloadavg()[0]:.1f}: wall times grow with load, CPU times do not)")
    doc = {"slots": args.slots, "observed": len(data.labels), "cpus": os.cpu_count(),
           "load_avg_1m": os.getloadavg()[0], "python": platform.python_version(),
           "results": {k: {"avkit_wall_s": a[0], "avkit_cpu_s": a[1], "peer_wall_s": b and b[0],
                           "peer_cpu_s": b and b[1]} for k, (a, b) in results.items()}}
    write({Path(args.out): doc})


# ---- at scale: children, each sampled for its process tree's peak memory ------------------------------------


def _run_child(args: list[str]) -> tuple[dict, int]:
    """Run this file as a child Python; -> (its JSON result line, peak RSS of its process tree in bytes)."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    proc, peak, done = psutil.Process(child.pid), [0], threading.Event()

    def sample():
        while not done.is_set():
            try:
                peak[0] = max(peak[0], sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]))
            except psutil.Error:  # a process of the tree has just exited
                pass
            done.wait(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = child.communicate()
    done.set()
    t.join()
    if child.returncode != 0:
        raise RuntimeError(f"child {args} failed: {err.strip().splitlines()[-1] if err.strip() else child.returncode}")
    return json.loads(out.strip().splitlines()[-1]), peak[0]


def shard_sizes(slots: int) -> list[int]:
    """Slots of each replica shard of a `slots`-slot fleet trace (sizes differ by at most K-rounding)."""
    n = max(MIN_SHARDS, -(-slots // SHARD_SLOTS))
    return [slots // n + (i < slots % n) for i in range(n)]


def child_generate(path: str, slots: str, shard: str) -> None:
    """Draw replica shard `shard` (its own seed) of a fleet trace into `path`."""
    from avkit.config import SyntheticConfig
    from avkit.trace.synthetic import write_synthetic_trace

    t0 = time.perf_counter()
    write_synthetic_trace(path, SyntheticConfig(num_slots=int(slots), seed=int(shard)))
    print(json.dumps({"wall_s": time.perf_counter() - t0, "bytes": os.path.getsize(path)}))


def child_fit(engine: str, path: str, budget_mb: str, scratch: str) -> None:
    from avkit.config import FitConfig
    from avkit.fit import run_fit

    budget_mb = int(budget_mb)
    features = ("logit_qmax",) if engine == "deployed" else ()  # the fit a fleet deploys: one feature
    t0, c0 = time.perf_counter(), time.process_time()
    start = None
    if engine == "ray":  # the local cluster's start, timed on its own (RayEngine joins a started cluster)
        import ray

        ray.init(log_to_driver=False, include_dashboard=False, num_cpus=os.cpu_count(),
                 object_store_memory=min(1024, max(128, budget_mb // 2)) << 20)
        start = time.perf_counter() - t0
    r = run_fit([path], FitConfig(mode="batch", engine="memory" if engine == "deployed" else engine,
                                  memory_budget=budget_mb, scratch=scratch, features=features))
    print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "start_s": start,
                      "slope": r.coefficients["slope"],
                      "intercepts": r.coefficients["intercepts"], "observed": r.coefficients["trained_on"]["observed"],
                      "auc": next(x["auc"] for x in r.scores if x["feature"] == "logit_qmax" and x["scope"] == "all"
                                  and x["estimator"] == "batch_logistic")}))


def generate(slots: int, trace: str) -> dict:
    """Draw a synthetic fleet trace (a directory of replica shards, one child each, in turn);
    -> its row (wall time, size, the generators' peak RSS)."""
    Path(trace).mkdir(parents=True, exist_ok=True)
    wall, size, peak = 0.0, 0, 0
    for i, n in enumerate(shard_sizes(slots)):
        gen, gen_peak = _run_child(["--child-generate", str(Path(trace) / f"replica-{i:03d}.parquet"), str(n), str(i)])
        wall, size, peak = wall + gen["wall_s"], size + gen["bytes"], max(peak, gen_peak)
    print(f"{slots:>12,} slots: {len(shard_sizes(slots))} shards, {size / 2**30:.2f} GiB in {wall:.0f} s, "
          f"generator peak {peak / 2**20:.0f} MB", flush=True)
    return {"slots": slots, "engine": "generate", "wall_s": wall, "peak_rss_mb": peak / 2**20,
            "trace_gib": size / 2**30, "shards": len(shard_sizes(slots)), "load_avg_1m": os.getloadavg()[0]}


def run_scale(sizes: list[int], engines: list[str], scratch: str, budget_mb: int, out: Path,
              traces: str | None = None) -> None:
    """Fit each size with each engine; `traces`: a directory of traces drawn before by `--generate`
    (synthetic-{slots}/, kept), so that drawing them stays out of a timed, locked run."""
    import psutil

    cores = os.cpu_count() or 1
    previous = json.loads(out.with_suffix(".json").read_text())["rows"] if out.with_suffix(".json").exists() \
        and traces else []  # pieces of one grid run in several commands add up in one table
    rows = [r for r in previous if r["slots"] not in sizes or r["engine"] not in [*engines, "generate"]
            or (r["engine"] == "generate" and traces)]
    for slots in sizes:
        with tempfile.TemporaryDirectory(dir=scratch, prefix="avkit-bench-") as tmp:
            given = Path(traces or tmp) / f"synthetic-{slots}"
            trace = str(given)
            if not (traces and given.exists()):
                rows.append(generate(slots, trace))
            elif not any(r["slots"] == slots and r["engine"] == "generate" for r in rows):
                files = sorted(given.glob("*.parquet"))  # drawn before by --generate (its time is not here)
                rows.append({"slots": slots, "engine": "generate", "wall_s": None, "peak_rss_mb": None,
                             "shards": len(files), "trace_gib": sum(f.stat().st_size for f in files) / 2**30})
            # coefficients and AUC of the first engine run at this size (also in an earlier command)
            ref = next(({"slope": r["slope"], "intercepts": r["intercepts"], "auc": r["auc"]} for r in rows
                        if r["slots"] == slots and "slope" in r), None)
            for engine in engines:
                need = slots * MEMORY_BYTES_PER_SLOT
                if engine in ("memory", "deployed") and need > 0.4 * psutil.virtual_memory().available:  # a shared box
                    print(f"{'':>12}  memory: skipped (~{need / 2**30:.0f} GiB needed, "
                          f"{psutil.virtual_memory().available / 2**30:.0f} GiB available)", flush=True)
                    rows.append({"slots": slots, "engine": engine, "skipped": "trace larger than available RAM"})
                    continue
                res, peak = _run_child(["--child-fit", engine, trace, str(budget_mb), tmp])
                ref = ref or res
                row = {"slots": slots, "engine": engine, "wall_s": res["wall_s"], "cpu_s": res["cpu_s"],
                       "cluster_start_s": res["start_s"],
                       "load_avg_1m": os.getloadavg()[0], "slots_per_s": slots / res["wall_s"],
                       "slots_per_s_per_core": slots / res["wall_s"] / cores, "peak_rss_mb": peak / 2**20,
                       "max_coef_diff_vs_first": max(abs(res["slope"] - ref["slope"]), *(
                           abs(a - b) for a, b in zip(res["intercepts"], ref["intercepts"]))),
                       "auc_diff_vs_first": abs(res["auc"] - ref["auc"]), "slope": res["slope"],
                       "intercepts": res["intercepts"], "auc": res["auc"], "date": time.strftime("%Y-%m-%d %H:%M")}
                rows.append(row)
                _save(out, cores, budget_mb, rows)  # after every row: a long run keeps what it measured
                print(f"{'':>12}  {engine:9s} {res['wall_s']:7.1f} s  {row['slots_per_s'] / 1e6:6.2f} M slots/s "
                      f"({row['slots_per_s_per_core'] / 1e6:.2f} per core)  peak {row['peak_rss_mb']:7.0f} MB  "
                      f"coef diff {row['max_coef_diff_vs_first']:.1e}", flush=True)
    _save(out, cores, budget_mb, rows)


def _save(out: Path, cores: int, budget_mb: int, rows: list[dict]) -> None:
    doc = {"cores": cores, "budget_mb": budget_mb, "load_avg_1m": os.getloadavg()[0],
           "date": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}
    write({out.with_suffix(".json"): json.dumps(doc, indent=2) + "\n", out.with_suffix(".md"): _markdown(doc)})


def _markdown(doc: dict) -> str:
    order = {"generate": 0, "memory": 1, "deployed": 2, "streaming": 3, "ray": 4}
    body = []
    for r in sorted(doc["rows"], key=lambda r: (r["slots"], order.get(r["engine"], 9))):
        load = f"{r.get('load_avg_1m', float('nan')):.1f}"
        if "skipped" in r:
            body.append([f"{r['slots']:,}", r["engine"], f"skipped: {r['skipped']}", *[""] * 8])
        elif r["engine"] == "generate":
            body.append([f"{r['slots']:,}", f"(synthetic trace: {r.get('shards', 1)} replica shards, "
                         f"{r['trace_gib']:.2f} GiB)", "drawn before" if r["wall_s"] is None else f"{r['wall_s']:.1f}",
                         "", "", "", "", "" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:.0f}", "", load, ""])
        else:
            body.append([f"{r['slots']:,}", r["engine"], f"{r['wall_s']:.1f}",
                         "" if r.get("cluster_start_s") is None else f"{r['cluster_start_s']:.1f}",
                         f"{r['slots_per_s'] / 1e6:.2f}", f"{r['slots_per_s_per_core'] / 1e6:.2f}",
                         f"{r.get('cpu_s', float('nan')):.1f}", f"{r['peak_rss_mb']:.0f}",
                         f"{r['max_coef_diff_vs_first']:.1e}", load, r.get("date", "an earlier run")])
    heads = ["slots", "engine", "wall s", "of which Ray's start s", "M slots/s", "per core", "driver CPU s",
             "peak RSS MB (process tree)", "max coef diff", "load (1 min)", "measured"]
    return (f"# `avkit fit --mode batch` at scale ({doc['date']}, {doc['cores']} cores, memory budget "
            f"{doc['budget_mb']} MB, 1-min load average at the end {doc['load_avg_1m']:.1f})\n\n"
            + md_table(heads, body, [True, False, *[True] * 8, False]) +
            "\n\nEach size is a fleet of replica shards (`bench/fit.py --generate`); each engine runs in a fresh child "
            "process; `deployed` is the memory engine fitting and scoring only the written feature (`--features "
            "logit_qmax`); Ray's wall time includes the local cluster's start (`ray.init`, timed on its own, then "
            "joined by the fit); \"max coef diff\" is against the first engine run at that size; \"driver CPU s\" "
            "leaves out Ray's workers. Reading, goals and how each size was run: docs/fleet.md (\"Measured at "
            "scale\").\n")


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
    if args.generate:
        for slots in args.sizes:
            generate(slots, str(Path(args.generate) / f"synthetic-{slots}"))
    elif args.scale:
        run_scale(args.sizes, args.engines, args.scratch, args.budget_mb, RESULTS / "fit_scale", args.traces)
    else:
        bench(args)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child-generate"]:  # a child of --generate / --scale (its memory is sampled)
        child_generate(*sys.argv[2:])
    elif sys.argv[1:2] == ["--child-fit"]:
        child_fit(*sys.argv[2:])
    else:
        main()
