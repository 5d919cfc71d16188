"""What the serve tests share: a server config around conftest's `serve_pair`, a running server,
/metrics as a dict."""

from __future__ import annotations

import time
from contextlib import contextmanager

import httpx
from prometheus_client.parser import text_string_to_metric_families

from avkit.config import ServeConfig
from avkit.serve.server import build_state
from avkit.serve.testing import serve_in_thread

VOCAB = 384
PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "import numpy as np"]


def serve_config(pair, tmp_path, **kw) -> ServeConfig:
    tpath, dpath = pair[:2]
    base = {"target": str(tpath), "draft": str(dpath), "served_model_name": "tiny",
            "snapshot": str(tmp_path / "snap.json"), "k": 4, "max_concurrency": 4, "queue_size": 8,
            "max_len": 192, "max_tokens_limit": 120, "default_max_tokens": 24, "grace_period_s": 2.0,
            "cost": "roofline:cpu:1.5b"}  # pinned: the default would read a profiled table if this machine has one
    return ServeConfig(**{**base, **kw})


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
