"""Assemble a server from a `ServeConfig` and run it under uvicorn with a clean SIGTERM: the checks that fail
before the models load (one `avkit: error:` line), the warm start, the startup block, models, verify policy,
sink, engine factory, side writes (start and stop: docs/runtime.md, "Serving")."""

from __future__ import annotations

import functools
import ipaddress
import logging
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import uvicorn
from uvicorn.logging import DefaultFormatter

from avkit.config import (SERVE_STATE_DIR, SHIPPED_COEFFICIENTS, EngineConfig, SamplingConfig, ServeConfig,
                          default_cost_spec, shipped_file)
from avkit.errors import AvkitError, ConfigError
from avkit.estimators.coefficients import ServedPair, load_coefficients
from avkit.models import load_pair, placement
from avkit.models.native import build_in_child
from avkit.runtime.engine import Engine, make_engine
from avkit.runtime.request import Request
from avkit.scheduling.batch_schedule import make_scheduled
from avkit.scheduling.spec import ADAPTIVE, PolicySpec
from avkit.serve.app import asgi_app
from avkit.serve.engine_loop import EngineLoop
from avkit.serve.metrics import ServeMetrics
from avkit.serve.side_writes import ServeSink, SideWrites, Snapshots, cache_snapshot_of
from avkit.serve.state import ServeState
from avkit.staged import check_writable

log = logging.getLogger("avkit.serve")


@dataclass(frozen=True)
class WarmStart:
    path: str  # coefficients file ("" = the estimator's reference constants)
    source: str  # explicit | snapshot | shipped | reference


def snapshot_path(config: ServeConfig) -> Path:
    return Path(config.snapshot or f"{SERVE_STATE_DIR}/coefficients.json").expanduser()


def warm_start(config: ServeConfig) -> WarmStart:
    """The coefficients the adaptive policy starts from, and where they came from (see the module doc).
    A --cache-coefficients file (the suffix cache's rows' own estimator) is checked here too."""
    cache_file = config.adaptive.cache_coefficients
    if cache_file:
        if config.models.drafter != "hybrid":
            raise ConfigError(f"--cache-coefficients {cache_file}: scores the suffix cache's rows, which only "
                              "--drafter hybrid drafts")
        load_coefficients(cache_file, k=config.engine.k, drafter="suffix")
    if config.adaptive.coefficients:
        if not Path(config.adaptive.coefficients).expanduser().is_file():
            raise ConfigError(f"--coefficients: no such file: {config.adaptive.coefficients}")
        return WarmStart(config.adaptive.coefficients, "explicit")
    snap = snapshot_path(config)
    if config.resume and snap.is_file():
        return WarmStart(str(snap), "snapshot")
    shipped = shipped_file(SHIPPED_COEFFICIENTS)  # from the working directory or the repo root
    # build_state checks it was fitted for this K on the served pair (a default, not a demand: else not used)
    return WarmStart(str(shipped), "shipped") if shipped is not None else WarmStart("", "reference")


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening address, bound now (before the models load): a busy port or a bad host is one line."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        what = f"--port {port}: address already in use on {host}" if e.errno == 98 else \
            f"--host {host} --port {port}: cannot bind ({e.strerror})"
        raise ConfigError(what) from None
    sock.set_inheritable(True)
    return sock


def startup_block(config: ServeConfig, *, target, draft, device: str, dtype: str, warm: WarmStart) -> str:
    """The lines logged once at start: what this server runs and with which limits."""
    spec = config.engine.k > 0 and draft is not None
    models = f"{target.model_id}" + (f" + draft {draft.model_id} ({config.models.drafter} drafter)" if spec else
                                     " (target only, no speculative decoding)")
    if not spec:
        policy = "none (no draft)"
    elif config.policy in ADAPTIVE:
        policy = (f"{config.policy}, estimator {config.adaptive.estimator}, refit every {config.online.refit_interval} steps, "
                  f"draft gate {'on' if config.adaptive.draft_gate else 'off'}")
    else:
        policy = config.policy
    coeffs = {"explicit": f"{warm.path} (explicit --coefficients; an existing snapshot is not used)",
              "snapshot": f"{warm.path} (snapshot of an earlier run; --no-resume to ignore it)",
              "shipped": f"{warm.path} (shipped, fitted on the repository's traces)",
              "reference": "the estimator's reference constants (no coefficients file)"}[warm.source]
    host = f"[{config.http.host}]" if ":" in config.http.host else config.http.host
    lines = [
        ("listening", f"http://{host}:{config.http.port}/v1"),
        ("models", models),
        ("device", f"{device}, {dtype}"),
        ("K", str(config.engine.k if spec else 0)),
        ("policy", policy),
    ]
    if spec and config.policy in ADAPTIVE:
        lines += [("coefficients", coeffs)]
        if config.models.drafter == "hybrid":
            lines += [("cache rows", f"own estimator, {config.adaptive.cache_coefficients or 'reference constants'}")]
        lines += [("cost table", config.adaptive.cost or f"{default_cost_spec()} (default: `avkit profile`'s table "
                                                          "on this machine, else the CPU roofline)"),
                  ("snapshot", f"{snapshot_path(config)} every {config.snapshot_every} refits")]
    lines += [
        ("limits", f"concurrency {config.engine.concurrency}, queue {config.http.queue_size}, max_len "
                   f"{config.engine.max_len}, max_tokens {config.max_new_tokens}, body {config.http.max_body_bytes} bytes"),
        ("record", config.record or "off"),
        ("api key", "required" if config.http.api_key else "none"),
        ("access log", "on" if config.http.log_requests else "off (--log-requests)"),
    ]
    width = max(len(k) for k, _ in lines)
    return "avkit serve\n" + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in lines)


def make_policy(config: ServeConfig, coefficients: str, pair: ServedPair | None = None):
    """The verify policy `--policy` names (`PolicySpec.make`, as record and simulate make theirs): fixed K is -k;
    adaptive is warm-started from `coefficients` and learns its cost model."""
    arg = {"fixed": str(config.engine.k), "schedule": config.schedule,
           **dict.fromkeys(ADAPTIVE, config.adaptive.estimator)}
    spec = PolicySpec(config.policy, config.policy, arg.get(config.policy, ""))
    return spec.make(k=config.engine.k, cost=config.adaptive.cost or None, coefficients=coefficients, pair=pair,
                     config=config.online, adaptive=replace(config.adaptive, learn_cost=True))  # serve learns


def _trace_writer(config: ServeConfig, target, draft):
    if not config.record:
        return None
    from avkit.trace.schema import run_metadata  # lazy: pyarrow (--record only)
    from avkit.trace.writer import TraceWriter  # lazy: pyarrow (--record only)

    meta = run_metadata(target, draft, k=config.engine.k, drafter=config.models.drafter, seed=config.engine.seed,
                        datasets=["serve"], policy=config.policy, temperature="per-request", top_p="per-request")
    return TraceWriter(config.record, meta)  # flushed by ServeSink every record_flush_s


WARM_UP_PROMPT = 4  # tokens of the warm-up prompt (ids 1..4, in every vocabulary)


def warm_up(target, draft, config: EngineConfig) -> float:
    """What a first request would otherwise pay for (kernels, first forwards, first draws), on a throwaway
    engine of `config`'s K: one greedy and one sampled request; no sink, full verification, so nothing is
    recorded, counted or learned. Seconds taken."""
    t0 = time.perf_counter()
    new = config.k + 2  # at least one full verify step
    small = replace(config, concurrency=2, max_len=min(config.max_len, WARM_UP_PROMPT + new + 2 * (config.k + 1)))
    prompt = list(range(1, WARM_UP_PROMPT + 1))
    Engine(target, draft if config.k > 0 else None, small).generate([
        Request("warm-up-greedy", prompt, SamplingConfig(temperature=0.0, max_new_tokens=new)),
        Request("warm-up-sampled", prompt, SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=new, seed=0))])
    log.info("warm-up done in %.1f s: ready", time.perf_counter() - t0)
    return time.perf_counter() - t0


def build_state(config: ServeConfig, *, target=None, draft=None) -> ServeState:
    """Check the options (one `avkit: error:` line, before the models load), build the CPU kernels and load the
    models (unless given), build policy, sink and engine loop; nothing is started yet."""
    warm = warm_start(config)
    if warm.source == "snapshot" and config.models.drafter == "hybrid" and not config.adaptive.cache_coefficients \
            and cache_snapshot_of(Path(warm.path)).is_file():  # a resumed model snapshot's cache rows
        config = replace(config, adaptive=replace(config.adaptive,
                                                  cache_coefficients=str(cache_snapshot_of(Path(warm.path)))))
    if config.policy == "schedule":
        make_scheduled(config.schedule, k=config.engine.k)
    if config.record:  # a new file we can create: fail at start, not after an hour of serving
        if Path(config.record).expanduser().is_file():  # the trace written at shutdown would replace it
            raise ConfigError(f"--record {config.record}: exists; serve writes a new trace (give another path or "
                              "move the old file away)")
        check_writable(config.record, "--record")  # a directory, a parent that is a file, a folder we cannot write in
    device, dtype = placement(config.models.device, config.models.dtype)
    if target is None:
        log.info("loading %s%s", config.models.target, f" + {config.models.draft}" if config.models.has_draft else "")
        if device.type == "cpu":  # the native kernels, built in a child process that SIGTERM stops at once
            seconds = build_in_child(bf16=dtype == torch.bfloat16, log=lambda message: log.info("%s", message))
            if seconds:
                log.info("CPU kernels built in %.0f s", seconds)
    target, draft = load_pair(config.models, drafts=config.engine.k > 0, target=target, draft=draft)
    pair = ServedPair(target.model_id, draft.model_id if draft else "", target.sha256 or "",
                      (draft.sha256 or "") if draft else "")
    if warm.source == "shipped":
        try:  # the shipped fit is a default: fitted for another K or pair, it is not used (a given file must match)
            load_coefficients(warm.path, k=config.engine.k, pair=pair)
        except AvkitError as e:
            log.warning("not warm-starting from the shipped coefficients: %s", e)
            warm = WarmStart("", "reference")
    try:
        policy = make_policy(config, warm.path, pair) if draft is not None else None
    except AvkitError as e:
        if not warm.path:
            raise
        raise ConfigError(f"warm start from {warm.path} ({warm.source}): {e} (pass --no-resume, another "
                          "--snapshot or --coefficients)") from None
    side_writes = SideWrites()
    snapshots = Snapshots(policy, snapshot_path(config), config.snapshot_every, pair, side_writes)
    metrics = ServeMetrics(config.engine.k, snapshots.current)
    side_writes.failures = metrics.side_write_failures
    sink = ServeSink(metrics, _trace_writer(config, target, draft), f"serve-{uuid.uuid4().hex[:8]}", side_writes,
                     config.record_flush_s)
    engine_config = replace(config.engine, k=config.engine.k if draft is not None else 0)
    suffix_cache = None  # hybrid: one global tree for every request, kept when a failed engine is replaced
    if config.models.drafter == "hybrid" and draft is not None:
        from avkit.hvd.suffix_cache import SuffixCache  # lazy: the HVD stack (--drafter hybrid only)

        suffix_cache = SuffixCache()
        metrics.watch_suffix_cache(suffix_cache.memory)

    new_engine = functools.partial(make_engine, target, draft, engine_config, config.models, policy=policy, sink=sink,
                                   cache=suffix_cache)
    loop = EngineLoop(new_engine, max_concurrency=config.engine.concurrency, queue_size=config.http.queue_size,
                      metrics=metrics, on_step=snapshots.on_step,
                      warm_up=functools.partial(warm_up, target, draft, engine_config),
                      retry_after_s=config.http.retry_after_s)

    def close():  # never raises: each side write reports its own failure
        snapshots.close()
        sink.close()

    block = startup_block(config, target=target, draft=draft, device=str(device),
                          dtype=str(dtype).removeprefix("torch."), warm=warm)
    return ServeState(config=config, engine_loop=loop, tokenizer=target.tokenizer,
                      vocab_size=target.model.config.vocab_size,
                      model_name=config.http.served_model_name or target.model_id, metrics=metrics, on_close=close,
                      make_engine=new_engine, side_writes=side_writes, startup=block)


def uvicorn_server(state: ServeState, *, log_level: str = "info"):
    """A uvicorn Server whose first SIGTERM/SIGINT also stops admission in the engine loop."""
    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            state.begin_drain()
            super().handle_exit(sig, frame)

    cfg = state.config
    config = uvicorn.Config(asgi_app(state), host=cfg.http.host, port=cfg.http.port, log_level=log_level,
                            timeout_graceful_shutdown=max(1, round(cfg.http.grace_period)),
                            access_log=False, lifespan="on")
    return _Server(config)


@contextmanager
def serve_in_thread(state: ServeState, *, timeout_s: float = 30.0, log_level: str = "warning",
                    ready: bool = True) -> Iterator[str]:
    """A real server on a free port of 127.0.0.1 in a thread of this process (tests, bench/load_test.py): yields
    its base URL once the warm-up has run (`ready=False`: once it listens); shuts it down gracefully on exit."""
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn_server(state, log_level=log_level)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="avkit-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started or (ready and not state.engine_loop.ready and state.engine_loop.dead is None):
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("avkit test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        state.begin_drain()
        server.should_exit = True
        thread.join(timeout=timeout_s + state.config.http.grace_period)
        sock.close()


def bind_warning(config: ServeConfig) -> str | None:
    """The warning for a non-loopback bind without an API key (None when there is nothing to say)."""
    host = config.http.host
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        loopback = False
    if loopback or config.http.api_key:
        return None
    return f"binding {host} without --api-key: anyone who can reach this address can use the server"


def serve(config: ServeConfig, *, log_level: str = "info") -> bool:
    """Run until SIGTERM/SIGINT; True when a signal started the (graceful) shutdown. avkit's server log (startup
    block, side-write failures, access log) goes to stderr beside uvicorn's; avkit's logger is put back as it was
    on return, also when a start-up check fails (an in-process caller keeps its logging)."""
    logger = logging.getLogger("avkit")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s", use_colors=False))  # as uvicorn's
        logger.addHandler(handler)
    logger.setLevel(log_level.upper())
    logger.propagate = False
    sock = None
    try:
        sock = bind_socket(config.http.host, config.http.port)  # a busy port fails now, not after loading models
        if warning := bind_warning(config):
            log.warning("%s", warning)
        state = build_state(config)
        log.info("%s", state.startup)
        server = uvicorn_server(state, log_level=log_level)
        # uvicorn re-raises a captured SIGTERM after its graceful shutdown, with the handler that was
        # installed before it started; a no-op handler here makes that re-raise end the process with 0.
        previous = signal.signal(signal.SIGTERM, lambda *_: None)
        try:
            server.run(sockets=[sock])
        finally:
            signal.signal(signal.SIGTERM, previous)
        return state.drain_started is not None  # the shutdown began (a SIGTERM/SIGINT, uvicorn_server)
    finally:
        if sock is not None:
            sock.close()
        logger.handlers[:] = saved[0]
        logger.setLevel(saved[1])
        logger.propagate = saved[2]
