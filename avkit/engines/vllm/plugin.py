"""avkit inside vLLM: the general plugin vLLM loads in each of its processes (`vllm.general_plugins`), calling
`register()` before the model is built (docs/vllm.md, "the plugin"). Inert unless one of these is set:
  AVKIT_VLLM_TRACE         trace path (+ the generations table beside it); AVKIT_VLLM_FLUSH_S between flushes
  AVKIT_VLLM_COEFFICIENTS  warm-starts vLLM's OnlineAcceptanceEstimator; the predictor health.py scores
  AVKIT_VLLM_METRICS       1: calibration health on vLLM's /metrics (needs AVKIT_VLLM_COEFFICIENTS)
  AVKIT_VLLM_DATASET       the rows' `dataset` (default `vllm`); `extra_args` avkit_dataset / avkit_request_id win
  AVKIT_VLLM_META          a JSON object of file metadata over the plugin's own
Nothing here may take a server down: a failure is one `avkit: error:` line and that part turns off.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from avkit.engines.vllm.version import SUPPORTED, error, supported

TRACE, COEFFICIENTS, METRICS, DATASET, META = ("AVKIT_VLLM_TRACE", "AVKIT_VLLM_COEFFICIENTS", "AVKIT_VLLM_METRICS",
                                               "AVKIT_VLLM_DATASET", "AVKIT_VLLM_META")
RUN_DIR = "AVKIT_VLLM_RUN_DIR"  # set by the first process that loads the plugin; its children inherit it
FLUSH, FLUSH_S = "AVKIT_VLLM_FLUSH_S", 5.0  # seconds between row-group flushes of the trace (env, default)


@dataclass(frozen=True)
class PluginEnv:
    """What the environment asks of the plugin (module docstring)."""

    trace: str = ""
    coefficients: str = ""
    metrics: bool = False
    dataset: str = "vllm"

    @classmethod
    def read(cls) -> PluginEnv:
        e = os.environ
        return cls(e.get(TRACE, ""), e.get(COEFFICIENTS, ""), e.get(METRICS, "0") not in ("", "0"),
                   e.get(DATASET, "vllm") or "vllm")

    @property
    def active(self) -> bool:
        return bool(self.trace or self.coefficients or self.metrics)


def _remove_run_dir(path: str, owner: int) -> None:
    """At exit of the process that made the run directory (not of a forked child that inherited the hook)."""
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


def register() -> None:
    """vLLM's `vllm.general_plugins` entry point (idempotent)."""
    env = PluginEnv.read()
    if not env.active:
        return
    import vllm  # lazy: vllm

    if not supported(vllm.__version__):
        error(f"vLLM {vllm.__version__} is not supported (avkit's plugin patches vLLM {SUPPORTED}); it stays off")
        return
    if RUN_DIR not in os.environ:
        os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="avkit-vllm-")
        atexit.register(_remove_run_dir, os.environ[RUN_DIR], os.getpid())
    # the draft features' torch path: a server never waits on avkit's C++ kernels compiling (or on another
    # process's build lock) at its first step; the kernel computes the same numbers
    os.environ.setdefault("AVKIT_CPU_KERNELS", "0")
    if env.metrics and not env.coefficients:
        error(f"{METRICS}=1 needs {COEFFICIENTS} (the predictor it scores); calibration health is off")
    try:
        _install(env)
    except Exception as e:  # vLLM calls plugins unguarded: nothing may raise into it
        error(f"the vLLM plugin could not install ({type(e).__name__}: {e}); it stays off")


def _install(env: PluginEnv) -> None:
    if env.coefficients:
        install_warm_start(env.coefficients)
    if env.trace or (env.metrics and env.coefficients):
        from avkit.engines.vllm import hooks  # lazy: torch

        rec = hooks.install()
        if rec.on_step is None:
            global OBSERVER
            OBSERVER = Observer(env, hooks)
            rec.on_step, rec.on_step_end = OBSERVER.on_step, OBSERVER.on_step_end


FEATURE = "logit_qmax"  # vLLM's acceptance estimator feature


def _served_pair() -> tuple[str, str]:
    """(target, draft) of the vLLM config being built, ("", "") when none is current."""
    from vllm.config import get_current_vllm_config_or_none  # lazy: vllm

    config = get_current_vllm_config_or_none()
    if config is None or config.model_config is None:
        return "", ""
    spec = config.speculative_config
    return str(config.model_config.model), str(spec.model or "") if spec is not None else ""


def warm_start_coefficients(path: str, k: int) -> dict | None:
    """The coefficients file checked for an estimator of `k` steps on the served pair (estimators/coefficients.py,
    feature logit_qmax), or None after one error line."""
    from avkit.estimators.coefficients import ServedPair, load_coefficients  # lazy: vllm venv

    target, draft = _served_pair()
    try:
        doc = load_coefficients(path, k=k, pair=ServedPair(target=target, draft=draft))
    except Exception as e:  # AvkitError: its one line
        error(f"{e}; vLLM's acceptance estimator keeps its own start")
        return None
    if doc.get("feature", FEATURE) != FEATURE:
        error(f"coefficients {path}: field 'feature' must be {FEATURE!r} (vLLM's estimator feature), got "
              f"{doc['feature']!r}; vLLM's acceptance estimator keeps its own start")
        return None
    return doc


def install_warm_start(path: str) -> None:
    """vLLM 0.32's OnlineAcceptanceEstimator (Model Runner V2) predicts sigmoid(omega logit(q_max) + beta_j) from
    omega 0.5, beta_j -0.2; no vLLM hook sets the start, so its `__init__` is wrapped: after vLLM's own, slope
    and intercepts are overwritten with the file's, when it passes `warm_start_coefficients` (idempotent)."""
    from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import OnlineAcceptanceEstimator  # lazy: vllm

    if getattr(OnlineAcceptanceEstimator, "_avkit_warm_start", None) is not None:
        return
    original = OnlineAcceptanceEstimator.__init__

    def __init__(self, max_num_reqs, num_speculative_steps, device, *args, **kwargs):
        original(self, max_num_reqs, num_speculative_steps, device, *args, **kwargs)
        doc = warm_start_coefficients(path, num_speculative_steps)
        if doc is not None:
            self.slope.fill_(float(doc["slope"]))
            self.intercepts.copy_(self.intercepts.new_tensor(doc["intercepts"]))

    OnlineAcceptanceEstimator.__init__ = __init__
    OnlineAcceptanceEstimator._avkit_warm_start = path


OBSERVER = None  # this process's Observer, once installed


def finish() -> None:
    """An offline `LLM` whose requests all finished: write the last generations rows and close both tables."""
    if OBSERVER is not None:
        OBSERVER.finish()


def _metadata(config, k: int, dataset: str) -> dict[str, str]:
    """The trace's file metadata (trace/schema.py META_KEYS) from vLLM's config; sampling is per request, so
    temperature and top-p are in the rows only ("mixed" here)."""
    import vllm  # lazy: vllm

    from avkit.trace.schema import run_metadata  # lazy: pyarrow

    spec = config.speculative_config
    return run_metadata(str(config.model_config.model), str(spec.model) if spec.model else None, k=k,
                        temperature="mixed", top_p="mixed",
                        drafter=spec.method if spec.method in ("ngram", "suffix") else "model",  # hooks.py's rows
                        seed=config.model_config.seed, datasets=[dataset], policy="full",
                        engine=f"vllm {vllm.__version__}",
                        **{"vllm.draft_sample_method": str(spec.draft_sample_method)})


def _emitted(tokens: list[int], sp) -> tuple[list[int], str]:
    """What vLLM returned of a request's tokens, and why it stopped: the worker's state can hold accepted
    drafts past the end (the scheduler cuts a multi-token step at the first stop token, after min_tokens, and at
    max_tokens)."""
    stops = set(getattr(sp, "all_stop_token_ids", None) or ())
    floor = getattr(sp, "min_tokens", 0) or 0
    cut = next((i + 1 for i, t in enumerate(tokens) if t in stops and i + 1 > floor), None)
    limit = getattr(sp, "max_tokens", None)
    if cut is not None and (limit is None or cut <= limit):
        return tokens[:cut], "stop"
    return (tokens[:limit], "length") if limit is not None and len(tokens) >= limit else (tokens, "stop")


class Observer:
    """In the worker: each engine step's verified slots -> the trace and the calibration health."""

    def __init__(self, env: PluginEnv, hooks):
        self.env, self.engine_step, self.t_start, self.off = env, 0, 0.0, False
        self.hooks = hooks  # avkit.engines.vllm.hooks, installed (imports torch: not at this module's top)
        self.sink = None  # (TraceWriter, GenerationWriter), opened at the first step that verified drafts
        self.health = None  # health.Health, made at that step
        self.runner = None  # vLLM's model runner, as last seen

    def on_step(self, runner, scheduler_output) -> None:
        """As an engine step starts: slots the last step left (it drafted nothing), the finished requests."""
        self._observe(runner, scheduler_output.finished_req_ids)
        self.t_start = time.perf_counter()
        self.engine_step += 1

    def on_step_end(self, runner) -> None:
        """Once a step's drafting is done: the slots it verified."""
        self._observe(runner, ())

    def _observe(self, runner, finished) -> None:
        self.runner = runner
        if not self.off:
            try:
                records = self.hooks.RECORDER.take_rows()
                if records:
                    self._emit(runner, records, (time.perf_counter() - self.t_start) * 1e3)
                self._finished(runner, finished)
            except Exception as e:  # a failing side write never takes the server down
                self.off = True
                error(f"the vLLM plugin stopped observing ({type(e).__name__}: {e})")
        self.hooks.RECORDER.active = not self.off

    def _label(self, sp, rid: str) -> tuple[str, str]:
        """(request id, dataset) of a request in the tables: its `extra_args`, else vLLM's id and the env's label."""
        extra = getattr(sp, "extra_args", None) or {}
        return str(extra.get("avkit_request_id", rid)), str(extra.get("avkit_dataset", self.env.dataset))

    def _emit(self, runner, records: list[dict], step_ms: float) -> None:
        sps = {r["request_id"]: runner.requests[r["request_id"]].sampling_params for r in records}
        requests = {rid: (*self._label(sp, rid), float(sp.temperature), float(sp.top_p)) for rid, sp in sps.items()}
        cols = self.hooks.slot_columns(records, requests, step_ms, self.engine_step - 1)
        if self.env.trace:
            if self.sink is None:
                self.sink = self._open(runner)
            self.sink[0].write({"run_id": np.full(len(cols["position"]), self.run_id, dtype=object), **cols})
        if self.env.metrics and self.env.coefficients:
            if self.health is None:
                self.health = self._health(runner.vllm_config.speculative_config.num_speculative_tokens)
            if self.health is not None:
                acc = np.where(cols["accepted"].mask, -1, cols["accepted"].filled(False).astype(np.int64))
                self.health.add_step(cols["logit_qmax"].astype(np.float64), cols["position"].astype(np.int64),
                                     cols["verified"], acc, cols["position"] == 0)
                self.health.publish(Path(os.environ[RUN_DIR]))

    def _health(self, k: int):
        from avkit.engines.vllm.health import Health  # lazy: vllm venv
        from avkit.estimators.coefficients import load_coefficients  # lazy: vllm venv

        try:
            doc = load_coefficients(self.env.coefficients, k=k)
        except Exception as e:  # AvkitError: one line, health off
            self.env = replace(self.env, metrics=False)
            error(f"calibration health off: {e}")
            return None
        return Health(k, doc["slope"], doc["intercepts"])

    def _open(self, runner):
        from avkit.trace.schema import generations_path  # lazy: pyarrow
        from avkit.trace.writer import GenerationWriter, TraceWriter  # lazy: pyarrow

        if Path(self.env.trace).exists():
            raise FileExistsError(f"{TRACE} {self.env.trace} exists; the plugin writes a new trace only (nothing "
                                  "is clobbered): choose another path")
        meta = {**_metadata(runner.vllm_config, runner.vllm_config.speculative_config.num_speculative_tokens,
                            self.env.dataset),
                **json.loads(os.environ.get(META, "") or "{}")}
        self.run_id = f"{Path(self.env.trace).stem}-{time.strftime('%Y%m%dT%H%M%S')}-{os.urandom(2).hex()}"
        flush = float(os.environ.get(FLUSH, FLUSH_S))
        trace = TraceWriter(self.env.trace, meta, flush_interval_s=flush)
        gens = GenerationWriter(generations_path(Path(self.env.trace)), meta, flush_interval_s=flush)
        for w in (trace, gens):  # a server is never finished: every flush replaces the complete file at its
            w.partial = w.path  # path (temp file + rename), readable while vLLM runs and after it is killed
        atexit.register(self.close)
        return trace, gens

    def _finished(self, runner, finished) -> None:
        for rid in finished:
            self.hooks.RECORDER.forget(rid)
            state = runner.requests.get(rid)
            if self.sink is None or state is None or state.prompt_token_ids is None:
                continue
            out, reason = _emitted(list(state.output_token_ids), state.sampling_params)
            name, dataset = self._label(state.sampling_params, rid)
            self.sink[1].write({"run_id": [self.run_id], "request_id": [name], "dataset": [dataset],
                                "prompt_ids": [list(state.prompt_token_ids)], "output_ids": [out],
                                "finish_reason": [reason]})

    def finish(self) -> None:
        """An offline `LLM` whose requests all finished: the worker still holds the last ones (it would learn
        that they finished at a next step), so their generations rows are written now; then `close`."""
        if self.runner is not None and not self.off:
            self._finished(self.runner, list(self.runner.requests))
        self.close()

    def close(self) -> None:
        """At a clean exit: the buffered rows, compacted, at the path."""
        if self.sink is None:
            return
        sink, self.sink = self.sink, None
        try:
            for w in sink:
                w.close()
        except Exception as e:
            error(f"closing the trace failed ({type(e).__name__}: {e}); {self.env.trace} holds what was flushed")
