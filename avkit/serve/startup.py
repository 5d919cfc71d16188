"""What a server checks and says before it serves: a bad option fails here, before the models load, in one
`avkit: error:` line; the warm start (docs/runtime.md, "Serving")."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from avkit.config import DEFAULT_COST_PATH, SERVE_STATE_DIR, SHIPPED_COEFFICIENTS, ServeConfig, shipped_file
from avkit.errors import AvkitError, ConfigError
from avkit.estimators.coefficients import load_coefficients
from avkit.scheduling.spec import ADAPTIVE
from avkit.staged import check_writable


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
    if shipped is not None:
        try:  # the shipped fit is a default, not a demand: it applies only to the K it was fitted for
            load_coefficients(shipped, k=config.engine.k)
        except AvkitError:
            return WarmStart("", "reference")
        return WarmStart(str(shipped), "shipped")  # build_state also checks it was fitted on the served pair
    return WarmStart("", "reference")


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


def check_record_writable(path: str) -> None:
    """--record must be a new file we can create: fail at start, not after an hour of serving."""
    if Path(path).expanduser().is_file():  # the trace written at shutdown would replace it: never clobbered
        raise ConfigError(f"--record {path}: exists; serve writes a new trace (give another path or move the old "
                          "file away)")
    check_writable(path, "--record")  # a directory, a parent that is a file, a folder we cannot write in


def _cost_source(config: ServeConfig) -> str:
    if config.adaptive.cost:
        return config.adaptive.cost
    default = Path(DEFAULT_COST_PATH).expanduser()
    return f"{default} (profiled on this machine)" if default.is_file() else \
        "roofline:cpu:1.5b (default; run `avkit profile` for this machine's table)"


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
        lines += [("cost table", _cost_source(config)),
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
