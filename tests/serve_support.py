"""What the serve tests share: a server config around conftest's `serve_pair`, a running server,
/metrics as a dict."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx
from prometheus_client.parser import text_string_to_metric_families

from avkit.config import AdaptiveConfig, EngineConfig, EstimatorConfig, HttpConfig, ModelsConfig, ServeConfig
from avkit.serve.server import build_state, serve_in_thread

VOCAB = 384
PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "import numpy as np"]


def serve_config(pair, tmp_path, *, draft: str | None = None, max_concurrency: int = 4, host: str = "127.0.0.1",
                 api_key: str = "", coefficients: str = "", queue_size: int = 8, log_requests: bool = False,
                 refit_interval: int = EstimatorConfig().refit_interval, drafter: str = "model",
                 max_body_bytes: int = HttpConfig().max_body_bytes, draft_gate: bool = True, **kw) -> ServeConfig:
    """The tests' server: the tiny pair, K = 4, small limits; `kw` sets ServeConfig's own fields."""
    tpath, dpath = pair[:2]
    return ServeConfig(
        models=ModelsConfig(target=str(tpath), draft=str(dpath) if draft is None else draft, drafter=drafter),
        engine=EngineConfig(k=4, concurrency=max_concurrency, max_len=192),
        online=EstimatorConfig(refit_interval=refit_interval),
        # cost pinned: the default would read a profiled table if this machine has one
        adaptive=AdaptiveConfig(coefficients=coefficients, cost="roofline:cpu:1.5b", draft_gate=draft_gate),
        http=HttpConfig(host=host, api_key=api_key, served_model_name="tiny", queue_size=queue_size,
                        grace_period=2.0, log_requests=log_requests, max_body_bytes=max_body_bytes),
        **{"snapshot": str(tmp_path / "snap.json"), "max_new_tokens": 120, "default_max_tokens": 24, **kw})


@contextmanager
def running_server(pair, tmp_path, **kw):
    state = build_state(serve_config(pair, tmp_path, **kw), target=pair[2], draft=pair[3])
    with serve_in_thread(state) as url:
        yield url, state


def metrics(url: str, headers=None) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics", headers=headers).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def wait_for(predicate, timeout=20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_process(pair, *args: str, timeout: float = 120.0):
    """`python -m avkit serve` on the tiny pair (K 4, max_len 192, model name `tiny`, no draft gate: tiny
    random drafts rarely pay, the gate would skip the steps that refit) -> (process, base URL) once
    /health answers; killed on exit if still running."""
    port = free_port()
    cmd = [sys.executable, "-m", "avkit", "serve", "--target", str(pair[0]), "--draft", str(pair[1]),
           "--port", str(port), "--k", "4", "--max-len", "192", "--served-model-name", "tiny",
           "--log-level", "warning", "--policy", "adaptive-stop-nogate", *args]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"

    def up():
        try:
            return httpx.get(url + "/health").status_code == 200
        except httpx.TransportError:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            return False

    try:
        assert wait_for(up, timeout=timeout)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
