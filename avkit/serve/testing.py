"""Run a real server on loopback inside this process (tests and the load benchmark).

`serve_in_thread(state)` binds 127.0.0.1 on a free port (the socket is bound before uvicorn starts,
so there is no port race), runs uvicorn in a thread, yields the base URL, and shuts it down
gracefully (lifespan shutdown included) on exit. It yields once the warm-up has run (`/health` 200)
unless `ready=False`.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from avkit.serve.app import asgi_app
from avkit.serve.state import ServeState


@contextmanager
def serve_in_thread(state: ServeState, *, timeout_s: float = 30.0,
                    log_level: str = "warning", ready: bool = True) -> Iterator[str]:
    import uvicorn  # lazy: uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(asgi_app(state), log_level=log_level, lifespan="on", access_log=False,
                            timeout_graceful_shutdown=max(1, int(state.config.http.grace_period)))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="avkit-uvicorn",
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started or (ready and not state.engine_loop.ready and state.engine_loop.dead is None):
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("avkit test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        state.begin_drain()
        server.should_exit = True
        thread.join(timeout=timeout_s + state.config.http.grace_period)
        sock.close()
