"""Assemble a server from a `ServeConfig` and run it under uvicorn with a clean SIGTERM.

Pieces: models (`avkit.models.load`), the verify policy (`POLICIES[config.policy]`, adaptive by
default, warm-started from the snapshot or the deployed coefficients), a sink that feeds
`/metrics` and, with `--record`, a `TraceWriter`, the engine factory for `EngineLoop`.
Shutdown order on SIGTERM: stop admitting (503) -> uvicorn drains connections for the grace
period -> the engine loop cancels what is left -> coefficients snapshot -> trace closed -> exit 0.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import uuid
from pathlib import Path

import numpy as np

from avkit.config import SERVE_STATE_DIR, SHIPPED_COEFFICIENTS, ServeConfig
from avkit.errors import AvkitError, ConfigError
from avkit.estimators.coefficients import ServedPair, load_coefficients
from avkit.serve.app import ServeState, build_app
from avkit.serve.engine_loop import EngineLoop
from avkit.serve.metrics import ServeMetrics
from avkit.serve.snapshot import CoefficientSnapshots

log = logging.getLogger("avkit.serve")


class ServeSink:
    """The engine's TraceSink while serving: per-position metrics, and the trace file with --record."""

    def __init__(self, metrics: ServeMetrics, writer=None, run_id: str = ""):
        self.metrics, self.writer, self.run_id = metrics, writer, run_id

    def emit(self, columns: dict[str, np.ndarray]) -> None:
        self.metrics.observe_rows(columns)
        if self.writer is not None:
            n = len(columns["position"])
            self.writer.write({"run_id": np.full(n, self.run_id, dtype=object), **columns})

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def snapshot_path(config: ServeConfig) -> Path:
    return Path(config.snapshot or f"{SERVE_STATE_DIR}/coefficients.json").expanduser()


def shipped_coefficients() -> Path | None:
    """The coefficients fitted on the shipped traces, from the working directory or the repo root."""
    import avkit

    for root in (Path.cwd(), Path(avkit.__file__).resolve().parents[1]):
        if (root / SHIPPED_COEFFICIENTS).is_file():
            return root / SHIPPED_COEFFICIENTS
    return None


def warm_start(config: ServeConfig) -> str:
    """Coefficients to start from: the live snapshot (resume) if there is one, else --coefficients,
    else the shipped fit, else the estimator's reference constants ("")."""
    snap = snapshot_path(config)
    if config.resume and snap.is_file():
        return str(snap)
    if config.coefficients:
        if not Path(config.coefficients).expanduser().is_file():
            raise ConfigError(f"--coefficients: no such file: {config.coefficients}")
        return config.coefficients
    shipped = shipped_coefficients()
    if shipped is None:
        return ""
    try:  # the shipped fit is a default, not a demand: it applies only to the K it was fitted for
        load_coefficients(shipped, k=config.k)
    except AvkitError:
        return ""
    return str(shipped)


def make_policy(config: ServeConfig, coefficients: str, pair: ServedPair | None = None):
    """The verify policy by name from the registry; adaptive gets its estimator (warm-started from
    `coefficients`, refitting every `refit_interval` steps), the cost table and its draft gate."""
    import avkit.scheduling.adaptive  # noqa: F401 - registers POLICIES["adaptive"]
    from avkit.config import AdaptiveConfig, EstimatorConfig
    from avkit.scheduling.policy import make_policy as make

    if config.policy == "fixed":
        return make("fixed", k=config.k)
    if config.policy == "adaptive":
        return make("adaptive", cost=config.cost or None, estimator=config.estimator,
                    coefficients=coefficients, k=config.k, pair=pair,
                    config=EstimatorConfig(refit_interval=config.refit_interval),
                    adaptive=AdaptiveConfig(gate=config.draft_gate))
    return make(config.policy)


def _trace_writer(config: ServeConfig, target, draft):
    if not config.record:
        return None
    from avkit import __version__
    from avkit.trace.writer import TraceWriter

    meta = {"avkit.version": __version__, "avkit.target": target.model_id,
            "avkit.target_sha256": target.sha256, "avkit.draft": draft.model_id if draft else "",
            "avkit.draft_sha256": draft.sha256 if draft else "",
            "avkit.k": str(config.k), "avkit.drafter": config.drafter, "avkit.seed": str(config.seed),
            "avkit.datasets": '["serve"]', "avkit.policy": config.policy,
            "avkit.temperature": "per-request", "avkit.top_p": "per-request"}
    return TraceWriter(config.record, meta, flush_interval_s=30.0)


def build_state(config: ServeConfig, *, target=None, draft=None) -> ServeState:
    """Load models (unless given), build policy, sink and engine loop; nothing is started yet."""
    from avkit.models import load
    from avkit.models.placement import placement
    from avkit.runtime.engine import Engine, EngineConfig

    coefficients = warm_start(config)
    device, dtype = placement(config.device, config.dtype)
    target = target if target is not None else load(config.target, dtype=dtype, device=device)
    use_draft = config.draft not in ("", "none") and config.k > 0
    if draft is None and use_draft:
        draft = load(config.draft, dtype=dtype, device=device)
    draft = draft if use_draft else None
    pair = ServedPair(target.model_id, draft.model_id if draft else "", target.sha256 or "",
                      (draft.sha256 or "") if draft else "")
    if coefficients and coefficients == str(shipped_coefficients()):
        try:  # the shipped fit is a default: fitted on another pair, it is not used (a given file must match)
            load_coefficients(coefficients, k=config.k, pair=pair)
        except AvkitError as e:
            log.warning("not warm-starting from the shipped coefficients: %s", e)
            coefficients = ""
    try:
        policy = make_policy(config, coefficients, pair) if draft is not None else None
    except AvkitError as e:
        if not coefficients:
            raise
        raise ConfigError(f"warm start from {coefficients}: {e} (pass --no-resume, another --snapshot or "
                          "--coefficients)") from None
    snapshots = CoefficientSnapshots(policy, snapshot_path(config), config.snapshot_every, pair)
    metrics = ServeMetrics(config.k, snapshots.current)
    sink = ServeSink(metrics, _trace_writer(config, target, draft), run_id=f"serve-{uuid.uuid4().hex[:8]}")
    engine_config = EngineConfig(k=config.k if draft is not None else 0, max_batch=config.max_concurrency,
                                 max_len=config.max_len, seed=config.seed)

    def make_engine():
        drafter = None  # the engine builds the model drafter itself
        if config.drafter == "hybrid" and draft is not None:
            from avkit.drafters.hybrid import make_hybrid_drafter

            drafter = make_hybrid_drafter(draft, config.max_concurrency, config.max_len, k=config.k,
                                          payoff_path=config.payoff or None, tokenizer=config.target)
        return Engine(target, draft, engine_config, policy=policy, sink=sink, drafter=drafter)

    loop = EngineLoop(make_engine, max_concurrency=config.max_concurrency, queue_size=config.queue_size,
                      metrics=metrics, on_step=snapshots.on_step)

    def close():
        snapshots.write()
        sink.close()

    return ServeState(config=config, engine_loop=loop, tokenizer=target.tokenizer,
                      vocab_size=target.model.config.vocab_size,
                      model_name=config.served_model_name or target.model_id, metrics=metrics, on_close=close,
                      make_engine=make_engine)


def uvicorn_server(state: ServeState, *, log_level: str = "info"):
    """A uvicorn Server whose first SIGTERM/SIGINT also stops admission in the engine loop."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            state.begin_drain()
            super().handle_exit(sig, frame)

    cfg = state.config
    config = uvicorn.Config(build_app(state), host=cfg.host, port=cfg.port, log_level=log_level,
                            timeout_graceful_shutdown=max(1, round(cfg.grace_period_s)),
                            access_log=False, lifespan="on")
    return _Server(config)


def bind_warning(config: ServeConfig) -> str | None:
    """The warning for a non-loopback bind without an API key (None when there is nothing to say)."""
    if is_loopback(config.host) or config.api_key:
        return None
    return (f"binding {config.host} without --api-key: anyone who can reach this address can use "
            "the server")


def serve(config: ServeConfig, *, log_level: str = "info") -> None:
    """Run until SIGTERM/SIGINT; returns normally (exit code 0) after a graceful shutdown."""
    server = uvicorn_server(build_state(config), log_level=log_level)
    # uvicorn re-raises a captured SIGTERM after its graceful shutdown, with the handler that was
    # installed before it started; a no-op handler here makes that re-raise end the process with 0.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
