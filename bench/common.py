"""What every bench script shares: where results go, the header that says when, on what and by which command
they were measured, writing them all at once, the prompts as token ids, one run on avkit's engine (the clock vLLM's
side runs too), a phase of runs in interleaved rounds, paired ratios with a 95% interval, the vLLM peer process and the
tiny pair of dry runs.

    from common import RESULTS, header, write      # bench/ is on sys.path when a script runs
    write({RESULTS / "x.md": header("x.py") + table})

Glossary
--------
machine   CPU model, cores and widest bf16 path (AMX / AVX-512 / AVX2): what results rows are compared by
header    a Markdown title and one line: UTC date, machine, 1-minute load at the start, the command as typed
round     every config once, in an order rotated by one per round (no config always last), so that a drift
          of a shared box's load hits every config alike; `phase` runs rounds of configs on each run
paired    per round the ratio a / b; their geometric mean and Student-t interval over rounds (log scale)
peer      one vLLM process (bench/vllm_peer.py in vLLM's own venv) running a jobs file's configs
"""

from __future__ import annotations

import atexit
import datetime as dt
import gc
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from avkit.config import EngineConfig, ModelsConfig, ProfileConfig, SamplingConfig
from avkit.runtime.request import Request
from avkit.staged import StagedOutputs
from avkit.workloads import load_workload
from vllm_peer import drive

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
# 2 threads on cores 0-1 (vLLM defaults to 1 thread + 1 reserved core), 2 GiB of KV cache; a step may take
# minutes on a loaded box, past the default 300 s RPC timeout that otherwise kills the engine mid-run
VLLM_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "2",
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}


def machine() -> str:
    """This CPU as results rows are compared by: model name, cores, and its widest bf16 path."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []))
    isa = "AMX" if "amx_bf16" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "?"
    return f"{name}, {os.cpu_count()} cores, {isa}"


def load() -> float:
    """The 1-minute load average: timings on a shared box are read beside it."""
    return os.getloadavg()[0]


def uptime() -> str:
    """The 1-, 5- and 15-minute load averages as `uptime` prints them: "load average: 0.52, 0.58, 0.59"."""
    return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def today() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")


def header(title: str) -> str:
    """A results file's first lines: its title, then when (UTC), on what, under which load, by which command."""
    command = " ".join(["python", *(Path(a).as_posix() if i == 0 else a for i, a in enumerate(sys.argv))])
    return (f"# {title}\n\n{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {machine()}, load {load():.1f} at the "
            f"start; `{command}`\n\n")


def write(files: dict) -> list[Path]:
    """Each {path: str | bytes | JSON-able} to a temp file beside it, all renamed together at the end (or none)."""
    with StagedOutputs() as outputs:
        for path, body in files.items():
            tmp = outputs.file(path)
            if isinstance(body, bytes):
                tmp.write_bytes(body)
            else:
                tmp.write_text(body if isinstance(body, str) else json.dumps(body, indent=2))
    for path in files:
        print(f"wrote {path}", file=sys.stderr)
    return [Path(p) for p in files]


def csv(kind=str):
    """An argparse type: "a,b" -> [kind("a"), kind("b")]; argparse applies it to a string default too."""
    return lambda text: [kind(x) for x in text.split(",") if x]


# The options the model-running scripts share, one meaning each: name -> (argparse type, help); each script
# gives its own default (`options`)
OPTIONS = {
    "target": (str, "the target model: a registry alias, a cached HF id or a directory"),
    "draft": (str, "the draft model, as --target"),
    "target_dir": (str, "the target as a bf16 safetensors directory, what vLLM loads (default: the models cache's "
                        "`-hf` copy, `just peer-vllm`)"),
    "draft_dir": (str, "the draft, as --target-dir"),
    "dtype": (str, "both models' dtype, float32 or bfloat16 (bfloat16: as the shipped traces were recorded, avkit's "
                   "batch-invariant CPU kernels)"),
    "ks": (csv(int), "fixed K (comma-separated; 0: target-only)"),
    "concurrency": (csv(int), "concurrencies, comma-separated"),
    "temperatures": (csv(float), "temperatures, comma-separated"),
    "datasets": (csv(), "workloads, comma-separated (humaneval, sharegpt, ...)"),
    "max_new_tokens": (int, "new tokens per request"),
    "seed": (int, "sampling seed"),
    "threads": (int, "torch threads"),
    "vllm_python": (str, "the python of vLLM's venv (`just peer-vllm`)"),
    "vllm_timeout": (int, "seconds per vLLM process"),
    "coefficients": (str, "the adaptive estimator's warm start"),
    "tiny": (bool, "a dry run on tiny random models: checks the script runs (its numbers mean nothing)"),
}


def options(ap, **defaults) -> None:
    """Add ``--name`` from OPTIONS with this default for each ``name=default`` (a bool one is a flag)."""
    for name, default in defaults.items():
        kind, text = OPTIONS[name]
        if kind is bool:
            ap.add_argument("--" + name.replace("_", "-"), action="store_true", help=text)
        else:
            ap.add_argument("--" + name.replace("_", "-"), type=kind, default=default, help=text,
                            **({"choices": ("float32", "bfloat16")} if name == "dtype" else {}))


def rounds(configs: list, repeats: int) -> list[list]:
    """`repeats` rounds of every config, round r starting r configs later (module glossary)."""
    return [configs[r % len(configs):] + configs[:r % len(configs)] for r in range(repeats)]


def phase(runs: list[dict], configs: list[tuple], repeats: int = 1, budget_s: float = 0.0):
    """(run, config) in a phase's order: each run in turn, `repeats` whole rounds of the configs on it (`rounds`),
    the garbage (the last run's engine, its KV caches) collected between; no run starts once `budget_s` seconds
    (0: no limit) are spent."""
    start = time.perf_counter()
    for r in runs:
        if budget_s and time.perf_counter() - start > budget_s:
            print(f"budget of {budget_s} s spent: runs from {r['name']} on are left out", flush=True)
            return
        for cfg in (c for order in rounds(configs, repeats) for c in order):
            yield r, cfg
            gc.collect()


def paired_ratio(a, b, level: float = 0.95) -> dict:
    """exp(mean log(a / b)) over paired rounds and its Student-t interval (infinite with one round)."""
    from scipy import stats  # lazy: scipy (only the scripts that pair rounds pay its import)

    logs = np.log(np.asarray(a, dtype=np.float64) / np.asarray(b, dtype=np.float64))
    m, n = float(logs.mean()), logs.size
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * logs.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    return {"ratio": math.exp(m), "lo": math.exp(m - half), "hi": math.exp(m + half)}


def prompt_ids(tokenizer, dataset: str, n: int) -> list[list[int]]:
    """The first n prompts of a workload as the target's token ids: chat template (first turn, with the
    prompt's tools) or plain text; the same ids go to avkit and to vLLM."""
    return [p.token_ids(tokenizer) for p in load_workload(dataset, n, seed=0)]


def vllm_peer(python: str, jobs: dict, timeout: float, env: dict | None = None,
              capture: bool = False) -> tuple[list[dict], subprocess.CompletedProcess]:
    """Run `jobs` (bench/vllm_peer.py's jobs file) in one vLLM process -> (the runs it finished, the process)."""
    with tempfile.TemporaryDirectory(prefix="avkit-peer-") as d:
        jobs_path, res = Path(d) / "jobs.json", Path(d) / "results.json"
        jobs_path.write_text(json.dumps(jobs))
        proc = subprocess.run([python, str(BENCH / "vllm_peer.py"), str(jobs_path), str(res)],
                              env={**os.environ, **VLLM_ENV, "PYTHONPATH": "", **(env or {})}, timeout=timeout,
                              capture_output=capture, text=True)
        return (json.loads(res.read_text())["results"] if res.exists() else []), proc


def run_avkit(engine, r: dict) -> dict:
    """One run (vllm_peer.py's run dict) on avkit's `engine` under `drive`'s output-token clock, as vLLM's side
    runs it -> outputs [n], wall_s, in_flight, the step log, request_steps (engine steps summed over requests)."""
    n, got, request_steps = len(r["prompts"]), {}, []
    max_new = r.get("max_new") or [r["max_new_tokens"]] * n

    def add(i: int) -> None:
        engine.add_request(Request(f"r{i}", r["prompts"][i], SamplingConfig(
            temperature=r["temperature"], top_p=r["top_p"], max_new_tokens=max_new[i], seed=r["seed"]),
            r.get("dataset", "")))

    def step() -> list[tuple[int, list[int], bool]]:  # avkit's outputs are each step's new tokens
        out = []
        for o in engine.step():
            i = int(o.request_id[1:])
            got[i] = got.get(i, []) + o.new_token_ids
            out.append((i, got[i], o.finished))
        request_steps.append(len(out))
        return out

    t0 = time.perf_counter()
    outputs, in_flight, steps = drive({"arrival_tokens": [0] * n, **r}, add, step,
                                      lambda: len(engine.running) + len(engine.waiting))
    return {"outputs": outputs, "wall_s": time.perf_counter() - t0, "in_flight": in_flight, "steps": steps,
            "request_steps": sum(request_steps)}


def models_of(args) -> dict:
    """{"target", "draft"}: avkit's models from --target-dir / --draft-dir (a directory or a registry alias)."""
    from avkit.models.loader import load_pair  # lazy: torch (a report-only run needs none)

    pair = load_pair(ModelsConfig(target=args.target_dir, draft=args.draft_dir, device="cpu", dtype=args.dtype))
    return dict(zip(("target", "draft"), pair))


def engine_run(target, draft, r: dict, k: int, concurrency: int, policy=None) -> dict:
    """`run_avkit` on a new engine drafting `k` (0: target only, no draft model) with room for the run's longest
    prompt and new tokens -> its result, plus the engine's share of step time outside forwards (`outside`) and
    seconds in draft forwards (`draft_forward_s`; 0: the drafter never ran)."""
    from avkit.runtime.engine import Engine  # lazy: torch (a report-only run needs none)

    cfg = EngineConfig(k=k, concurrency=concurrency, seed=r["seed"],
                       max_len=max(map(len, r["prompts"])) + max(r.get("max_new") or [r["max_new_tokens"]]) + k + 2)
    engine = Engine(target, draft if k > 0 else None, cfg, policy=policy)
    res = run_avkit(engine, r)
    return {**res, "outside": engine.stats.overhead_share, "draft_forward_s": engine.stats.draft_forward_s}


def profile_here(target, draft, prompts: list[list[int]], new_tokens: int, k: int, max_requests: int,
                 temperature: float, repeats: int, path: Path):
    """This CPU's cost table at `temperature` (`avkit profile`'s step timing) for up to `max_requests` requests
    drafting `k`, at the context a decode step sees on average (prompt + half the new tokens, not the longest),
    saved to `path` -> the CostTable."""
    from avkit.scheduling.profile import profile_costs  # lazy: torch (a report-only run needs none)

    context = round(sum(map(len, prompts)) / len(prompts) + new_tokens / 2)
    table = profile_costs(target, draft, ProfileConfig(
        context_len=context, k=k, max_verify_tokens=max_requests * (k + 1), max_requests=max_requests,
        repeats=repeats, sampling=SamplingConfig(temperature=temperature)))
    print(f"cost table (T = {temperature:g}): {table.save(path)}", file=sys.stderr, flush=True)
    return table


def tiny_pair(prefix: str) -> tuple[str, str]:
    """A tiny random target and draft (two seeds) in a new temp directory that vLLM-CPU can load too (head
    size 64): what a script's --tiny dry run decodes with. The directory is removed when the process exits."""
    from avkit.models.testing import write_tiny_model  # lazy: torch (a report-only run needs none)

    root = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    kw = dict(vocab=512, init_std=0.3, hidden=128, heads=2, kv_heads=1, intermediate=256)
    return str(write_tiny_model(root / "t", seed=0, **kw)), str(write_tiny_model(root / "d", seed=1, **kw))

