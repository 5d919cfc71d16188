"""`bench/fit.py --scale` / `--generate` (bench/README.md: usage; a real Ray cluster): per size, replica shards
of at most SHARD_SLOTS drawn chunk by chunk, `avkit fit --mode batch` per engine in a fresh child process (this
file with --child-fit / --child-generate; wall, slots/s, the peak RSS of its process tree) -> fit_scale.{json,md}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from common import write

# lazy: avkit (and ray) are imported in the child functions that use them, since a child's peak memory is the
# measurement: it holds only what its own path runs

MEMORY_BYTES_PER_SLOT = 200  # in-memory fit: observed columns + features + predictions (measured: ~140 at 5M)


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    try:
        tree = [proc, *proc.children(recursive=True)]
    except psutil.Error:  # the child has just exited
        return 0
    for p in tree:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def _run_child(args: list[str]) -> tuple[dict, int]:
    """Run a child Python; -> (its JSON result line, peak RSS of its process tree in bytes)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    proc, peak, done = psutil.Process(child.pid), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc))
            done.wait(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = child.communicate()
    done.set()
    t.join()
    if child.returncode != 0:
        raise RuntimeError(f"child {args} failed: {err.strip().splitlines()[-1] if err.strip() else child.returncode}")
    return json.loads(out.strip().splitlines()[-1]), peak[0]


SHARD_SLOTS = 25_000_000  # slots per replica shard of a synthetic fleet trace (at least MIN_SHARDS shards)
MIN_SHARDS = 2


def shard_sizes(slots: int) -> list[int]:
    """Slots of each replica shard of a `slots`-slot fleet trace (sizes differ by at most K-rounding)."""
    n = max(MIN_SHARDS, -(-slots // SHARD_SLOTS))
    return [slots // n + (i < slots % n) for i in range(n)]


def child_generate(path: str, slots: int, shard: int) -> None:
    """Draw replica shard `shard` (its own seed) of a fleet trace into `path`."""
    from avkit.config import SyntheticConfig
    from avkit.trace.synthetic import write_synthetic_trace

    t0 = time.perf_counter()
    write_synthetic_trace(path, SyntheticConfig(num_slots=slots, seed=shard))
    print(json.dumps({"wall_s": time.perf_counter() - t0, "bytes": os.path.getsize(path)}))


def child_fit(engine: str, path: str, budget_mb: int, scratch: str) -> None:
    from avkit.config import FitConfig
    from avkit.fit import run_fit

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
        part = str(Path(trace) / f"replica-{i:03d}.parquet")
        gen, gen_peak = _run_child([str(Path(__file__).resolve()), "--child-generate", part, str(n), str(i)])
        wall, size, peak = wall + gen["wall_s"], size + gen["bytes"], max(peak, gen_peak)
    print(f"{slots:>12,} slots: {len(shard_sizes(slots))} shards, {size / 2**30:.2f} GiB in {wall:.0f} s, "
          f"generator peak {peak / 2**20:.0f} MB", flush=True)
    return {"slots": slots, "engine": "generate", "wall_s": wall, "peak_rss_mb": peak / 2**20,
            "trace_gib": size / 2**30, "shards": len(shard_sizes(slots)), "load_avg_1m": os.getloadavg()[0]}


def run_scale(sizes: list[int], engines: list[str], scratch: str, budget_mb: int, out: Path,
              traces: str | None = None) -> None:
    """Fit each size with each engine; `traces`: a directory of traces drawn before by `--generate`
    (synthetic-{slots}/, kept), so that drawing them stays out of a timed, locked run."""
    me = str(Path(__file__).resolve())
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
                res, peak = _run_child([me, "--child-fit", engine, trace, str(budget_mb), tmp])
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
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


def _save(out: Path, cores: int, budget_mb: int, rows: list[dict]) -> None:
    doc = {"cores": cores, "budget_mb": budget_mb, "load_avg_1m": os.getloadavg()[0],
           "date": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}
    write({out.with_suffix(".json"): json.dumps(doc, indent=2) + "\n", out.with_suffix(".md"): _markdown(doc)})


def _markdown(doc: dict) -> str:
    lines = [f"# `avkit fit --mode batch` at scale ({doc['date']}, {doc['cores']} cores, memory budget "
             f"{doc['budget_mb']} MB, 1-min load average at the end {doc['load_avg_1m']:.1f})", "",
             "| slots | engine | wall s | of which Ray's start s | M slots/s | per core | driver CPU s | "
             "peak RSS MB (process tree) | max coef diff | load (1 min) | measured |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    order = {"generate": 0, "memory": 1, "deployed": 2, "streaming": 3, "ray": 4}
    for r in sorted(doc["rows"], key=lambda r: (r["slots"], order.get(r["engine"], 9))):
        if "skipped" in r:
            lines.append(f"| {r['slots']:,} | {r['engine']} | skipped: {r['skipped']} | | | | | | | | |")
        elif r["engine"] == "generate":
            drawn = "drawn before" if r["wall_s"] is None else f"{r['wall_s']:.1f}"
            peak = "" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:.0f}"
            lines.append(f"| {r['slots']:,} | (synthetic trace: {r.get('shards', 1)} replica shards, "
                         f"{r['trace_gib']:.2f} GiB) | {drawn} | | | | | {peak} | | "
                         f"{r.get('load_avg_1m', float('nan')):.1f} | |")
        else:
            start = "" if r.get("cluster_start_s") is None else f"{r['cluster_start_s']:.1f}"
            lines.append(f"| {r['slots']:,} | {r['engine']} | {r['wall_s']:.1f} | {start} | {r['slots_per_s'] / 1e6:.2f} | "
                         f"{r['slots_per_s_per_core'] / 1e6:.2f} | {r.get('cpu_s', float('nan')):.1f} | "
                         f"{r['peak_rss_mb']:.0f} | {r['max_coef_diff_vs_first']:.1e} | "
                         f"{r.get('load_avg_1m', float('nan')):.1f} | {r.get('date', 'an earlier run')} |")
    lines += ["", "Each size is a fleet of replica shards (`bench/fit.py --generate`); each engine runs in a fresh child "
              "process; `deployed` is the memory engine fitting and scoring only the written feature (`--features "
              "logit_qmax`); Ray's wall time includes the local cluster's start (`ray.init`, timed on its own, then "
              "joined by the fit); \"max coef diff\" is against the first engine run at that size; \"driver CPU s\" leaves out Ray's "
              "workers. Reading, goals and how each size was run: docs/fleet.md (\"Measured at scale\")."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # a child of --generate / --scale (its memory is sampled)
    if sys.argv[1] == "--child-generate":
        child_generate(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        child_fit(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
