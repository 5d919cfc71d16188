"""GPU check: one prepared run that proves avkit's GPU runtime the first time a device is lent (docs/gpu.md).

    python bench/gpu_check.py                     # a CUDA machine: <= 8 min -> bench/results/gpu/<date>-<gpu>/
    python bench/gpu_check.py --dry-run           # the same code on this CPU at tiny sizes (tests/test_gpu_check.py)
    python bench/gpu_check.py --steps profile,sim --out DIR   # rerun some steps into the same directory

Steps, in order, each timed, guarded (an error is recorded and the next step runs) and bounded (its own time
limit plus what earlier steps left, inside --budget-s): pytest, kernels, engine and
profile (bench/gpu_steps.py), sim; docs/gpu.md says what each runs and decides. summary.json is rewritten after
every step (kernels.json and engine.json after every row); --bundle PATH packs the directory into PATH after
every step, so a run cut short returns files. The device image has no polars: it travels as the wheel in WHEELS.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from xml.etree import ElementTree

if "--dry-run" in sys.argv[1:]:  # before torch or triton is imported: Triton runs interpreted on the CPU, the
    os.environ.update(TRITON_INTERPRET="1", AVKIT_CPU_KERNELS="0",  # CPU's C++ kernels stay off (a GPU never
                      OMP_NUM_THREADS="1")  # runs them; no build in CI); tiny models: one thread
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the device runs a copy of the tree: avkit is not installed there

import torch  # noqa: E402
import triton  # noqa: E402

from avkit.staged import staged_file  # noqa: E402
from gpu_steps import engine_step, kernels_step, profile_step  # noqa: E402

WHEELS = ("polars-1.33.1-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",)  # 37.9 MiB, in .whl/
STEPS = ("pytest", "kernels", "engine", "profile", "sim")
PACKAGES = ("numpy", "polars", "pyarrow", "scipy", "transformers", "tokenizers", "typer", "rich", "pytest",
            "nvidia-ml-py", "cupy-cuda13x")  # the versions the run met (the device's own, or a carried wheel's)


@dataclass(frozen=True)
class Sizes:
    """Everything the dry run shrinks; the code paths stay the same."""

    budget_s: dict  # step -> seconds
    batches: tuple[int, ...]  # kernels: B
    vocab: int  # kernels: V
    matmul_n: int  # kernels: n of the n x n x n product timed for the roofline
    engine_vocab: int  # engine: the tiny models' vocabulary
    chi2_requests: int  # engine: seeded requests per engine in the T = 1 test
    shapes: tuple[str, ...]  # profile: keys of SHAPES, each (target, draft)
    context: int  # profile: synthetic KV context per request (the greedy trace's mean is 377 tokens)
    max_concurrency: int  # profile: largest batch profiled (less where the device's memory says so)
    repeats: int  # profile: timed runs per point
    tune_traces: tuple[str, ...]  # sim: what `avkit tune` simulates
    tune_concurrency: tuple[int, ...]  # sim: concurrencies simulated (cut at what was profiled)
    bootstrap: int  # sim: tune's bootstrap resamples
    hvd_traces: tuple[str, ...]  # sim: what `avkit hvd` replays
    hvd_epochs: int  # sim: payoff MLP epochs


REAL = Sizes(budget_s={"pytest": 75, "kernels": 90, "engine": 60, "profile": 60, "sim": 165},
             batches=(1, 64, 256), vocab=151_936, matmul_n=8192, engine_vocab=300, chi2_requests=4000,
             shapes=("pair", "8b"), context=512, max_concurrency=1024, repeats=5,
             tune_traces=("traces/greedy_k7.parquet",), tune_concurrency=(1, 4, 16, 64, 256, 1024), bootstrap=100,
             hvd_traces=("traces/greedy_k7.parquet", "traces/reuse/t0_bfcl_multiturn_k7.parquet",
                         "traces/reuse/t0_edit_k7.parquet", "traces/reuse/t0_mtbench_revise_k7.parquet",
                         "traces/reuse/t0_sharegpt_multiround_k7.parquet"), hvd_epochs=30)
DRY = Sizes(budget_s={"pytest": 60, "kernels": 60, "engine": 60, "profile": 60, "sim": 90},
            batches=(1, 3), vocab=1000, matmul_n=128, engine_vocab=300, chi2_requests=400,
            shapes=("tiny",), context=16, max_concurrency=4, repeats=1,
            tune_traces=("traces/reuse/t0_bfcl_multiturn_k7.parquet",), tune_concurrency=(1, 4), bootstrap=10,
            hvd_traces=("traces/reuse/t0_bfcl_multiturn_k7.parquet",), hvd_epochs=1)


class StepTimeout(BaseException):
    """Raised by the step's alarm; a BaseException so that no `except Exception` inside avkit swallows it."""


@dataclass
class Check:
    """One run: its sizes and device, and its results directory (summary.json, step files, the optional bundle)."""

    sizes: Sizes
    device: torch.device
    out: Path
    bundle: Path | None
    summary: dict

    def write_json(self, name: str, obj) -> Path:
        with staged_file(self.out / name) as tmp:
            tmp.write_text(json.dumps(obj, indent=1, default=str))
        return self.out / name

    def step(self, name: str, entry: dict) -> None:
        self.summary["steps"][name] = entry
        self.write_json("summary.json", self.summary)

    def pack(self) -> None:
        if self.bundle is not None:
            with staged_file(self.bundle) as tmp, tarfile.open(tmp, "w:gz") as tar:  # no staged temps inside
                tar.add(self.out, arcname=self.out.name, filter=lambda t: None if t.name.endswith(".tmp") else t)

    def run(self, name: str, cmd: list[str], timeout: float) -> dict:
        """A child process, its output into <name>.log; -> {cmd, rc (None: killed at `timeout` s), seconds}."""
        t0 = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        with open(self.out / f"{name}.log", "w") as log:
            try:
                rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=max(timeout, 1)).returncode
            except subprocess.TimeoutExpired:
                rc = None
        return {"cmd": " ".join(cmd), "rc": rc, "seconds": round(time.perf_counter() - t0, 1)}


def step_pytest(ctx: Check, limit: float) -> dict:
    """Every test that carries the `gpu` marker (they skip without CUDA: the dry run checks the command)."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if "mark.gpu" in p.read_text(encoding="utf-8"))
    xml = ctx.out / "pytest_gpu.xml"
    xml.unlink(missing_ok=True)  # a rerun into the same directory must not read the last run's
    res = ctx.run("pytest", [sys.executable, "-m", "pytest", "-m", "gpu and not slow", "-p", "no:cacheprovider",
                             "-q", f"--junitxml={xml}", *files], limit - 5)
    if not xml.is_file():
        return {**res, "files": files, "ok": False, "error": "no junit XML (killed at its limit?): see pytest.log"}
    suite = ElementTree.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return {**res, "files": files, **counts, "ok": res["rc"] == 0 and not counts["failures"] + counts["errors"]}


def step_sim(ctx: Check, limit: float) -> dict:
    """`avkit hvd` with the pair's table (the traces are the pair's), then `avkit tune` per measured table."""
    deadline = time.monotonic() + limit
    s, out, res = ctx.sizes, ctx.out, {}
    tables = {n: out / f"cost_{n}.json" for n in s.shapes if (out / f"cost_{n}.json").is_file()}
    if not tables:
        raise RuntimeError(f"no cost_*.json in {out}: run the profile step first")
    hvd_table = tables.get("pair", tables.get("tiny"))
    if hvd_table is not None:  # the decision HVD waits on first (the traces were recorded by this pair); it
        # leaves `avkit tune` a minute at least
        res["hvd"] = ctx.run("hvd", [sys.executable, "-m", "avkit", "hvd", *s.hvd_traces, "--cost-table",
                                     str(hvd_table), "--out", str(out / "hvd"), "--markdown", str(out / "hvd.md"),
                                     "--epochs", str(s.hvd_epochs)], max(limit / 2, deadline - time.monotonic() - 60))
        res["hvd"].update(hvd_headline(out / "hvd" / "hvd_metrics.json") if res["hvd"]["rc"] == 0 else {})
    for name, path in tables.items():
        profiled = json.loads(path.read_text())["draft_requests"][-1]
        conc = ",".join(str(c) for c in s.tune_concurrency if c <= profiled)
        res[f"tune_{name}"] = ctx.run(f"tune_{name}", [
            sys.executable, "-m", "avkit", "tune", *s.tune_traces, "--cost", str(path), "--concurrency", conc,
            "--bootstrap", str(s.bootstrap), "--out", str(out / f"tune_{name}.json")], deadline - time.monotonic())
        res[f"tune_{name}"].update(tune_headline(out / f"tune_{name}.json") if res[f"tune_{name}"]["rc"] == 0 else {})
    return {"ok": all(r["rc"] == 0 for r in res.values()), **res}


def tune_headline(path: Path) -> dict:
    """Per concurrency: the best fixed K, the best adaptive arm and their ratio; what tune recommends."""
    r = json.loads(path.read_text())
    rows = []
    for c in r["concurrency"]:
        cells = [x for x in r["cells"] if x["concurrency"] == c]
        fixed = max((x for x in cells if x["kind"] == "fixed"), key=lambda x: x["throughput_tok_s"])
        adaptive = max((x for x in cells if x["kind"].startswith("adaptive")), key=lambda x: x["throughput_tok_s"])
        nospec = next(x for x in cells if x["kind"] == "nospec")
        rows.append({"c": c, "best_fixed": fixed["arm"], "fixed_tok_s": round(fixed["throughput_tok_s"], 1),
                     "best_adaptive": adaptive["arm"], "adaptive_vs_fixed": round(adaptive["throughput_tok_s"]
                                                                                 / fixed["throughput_tok_s"], 4),
                     "nospec_tok_s": round(nospec["throughput_tok_s"], 1)})
    return {"per_concurrency": rows, "infeasible": [x["concurrency"] for x in r["infeasible"]],
            "kv_max_concurrency": r["memory"].get("max_concurrency"),
            "ranges": r["schedule"]["ranges"], "adaptive_on": r["schedule"]["adaptive"]}


def hvd_headline(path: Path) -> dict:
    """Per dataset: best single drafter, best router and its ratio, the clairvoyant bound (headroom)."""
    return {"per_dataset": [{k: v[k] for k in ("dataset", "best_single_router", "best_router", "ratio", "oracle",
                                               "headroom")} for v in json.loads(path.read_text())["verdict"]]}


RUNNERS = {"pytest": step_pytest, "kernels": kernels_step, "engine": engine_step, "profile": profile_step,
           "sim": step_sim}


def _alarm(signum, frame):
    raise StepTimeout


def run_steps(ctx: Check, names: list[str], budget_s: float) -> bool:
    """Each step under its limit (its budget plus what earlier steps left, never past the whole budget)."""
    t_end, spare = time.monotonic() + budget_s, 0.0
    signal.signal(signal.SIGALRM, _alarm)
    for name in names:
        limit = min(ctx.sizes.budget_s[name] + spare, t_end - time.monotonic())
        if limit < 2:
            ctx.step(name, {"ok": False, "error": "skipped: the run's time budget is spent"})
            continue
        print(f"gpu_check: {name} (limit {limit:.0f} s)", file=sys.stderr, flush=True)
        ctx.step(name, {"ok": False, "error": "running (no result yet: cut short?)"})
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            entry = RUNNERS[name](ctx, limit)
        except StepTimeout:
            entry = {"ok": False, "error": f"timed out after {limit:.0f} s"}
        except Exception as e:  # guarded: record and go on
            entry = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        if getattr(ctx.device, "type", "") == "cuda":  # what a failed or cut step held goes back before the next
            gc.collect()
            torch.cuda.empty_cache()
        spare = max(limit - entry["seconds"], 0.0)
        ctx.step(name, entry)
        ctx.pack()
        print(f"gpu_check: {name} {'ok' if entry.get('ok') else 'FAILED'} in {entry['seconds']} s"
              + ("" if entry.get("ok") else f": {entry.get('error', 'see the step file')}"), file=sys.stderr, flush=True)
    return all(ctx.summary["steps"][n].get("ok") for n in names)


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="this CPU, tiny sizes, Triton's interpreter")
    ap.add_argument("--out", default="", help="results directory (default bench/results/gpu/<date>-<gpu>; "
                                              "dry run: a new temporary directory)")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    ap.add_argument("--budget-s", type=float, default=450.0, help="the whole run's time limit, seconds")
    ap.add_argument("--bundle", default="", help="also pack the results directory into this .tar.gz after every step")
    a = ap.parse_args(argv)
    names = [s.strip() for s in a.steps.split(",") if s.strip()]
    if bad := [n for n in names if n not in STEPS]:
        ap.error(f"--steps: unknown step {bad[0]!r} (steps: {', '.join(STEPS)})")
    if not a.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if a.dry_run else "cuda")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu-dry-run"
    out = Path(a.out or (tempfile.mkdtemp(prefix="gpu_check_dry_") if a.dry_run else ROOT / "bench" / "results" / "gpu"
                         / f"{time.strftime('%Y-%m-%d')}-{re.sub('[^a-z0-9]+', '-', gpu.lower()).strip('-')}"))
    sizes = DRY if a.dry_run else REAL
    out.mkdir(parents=True, exist_ok=True)
    old = out / "summary.json"  # a rerun of some steps keeps the other steps' entries
    summary = json.loads(old.read_text()) if old.is_file() else {"steps": {}}
    summary.update(device=gpu, dry_run=a.dry_run, python=sys.version.split()[0], torch=torch.__version__,
                   triton=triton.__version__, cuda=torch.version.cuda, started=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                   command=" ".join([Path(sys.executable).name, *sys.argv]), wheels=list(WHEELS),
                   packages={n: _version(n) for n in PACKAGES}, sizes=asdict(sizes))
    check = Check(sizes, device, out, Path(a.bundle) if a.bundle else None, summary)
    ok = run_steps(check, names, a.budget_s)
    brief = {n: {k: v for k, v in e.items() if k != "traceback"} for n, e in summary["steps"].items()}
    print(json.dumps(brief, indent=1, default=str))  # the headline numbers, last in the output
    print(f"gpu_check: {'all steps ok' if ok else 'some steps FAILED'}; results in {out}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
