"""What `avkit serve` says it runs (issue 22 item 8): the startup block, where the coefficients came
from (an explicit --coefficients wins over a snapshot), and the access log behind --log-requests."""

from __future__ import annotations

import logging

import httpx
import pytest

from avkit.serve.server import build_state
from avkit.serve.side_writes import coefficients_of
from avkit.staged import write_json_atomic
from serve_support import running_server, serve_config


@pytest.fixture()
def files(pair, tmp_path):
    """A snapshot (slope 0.61) and a deployed coefficients file (slope 0.7) for the tiny pair's K = 4."""
    est = build_state(serve_config(pair, tmp_path, resume=False), target=pair[2], draft=pair[3]) \
        .make_engine().policy.estimator
    est.slope, est.intercepts[:] = 0.61, [0.5, 0.25, 0.0, -0.25]
    write_json_atomic(tmp_path / "snap.json", coefficients_of(est))
    write_json_atomic(tmp_path / "deployed.json", {**coefficients_of(est), "slope": 0.7})
    return tmp_path / "snap.json", tmp_path / "deployed.json"


@pytest.mark.parametrize("kw, slope, source", [
    ({}, 0.61, "snapshot of an earlier run"),
    ({"coefficients": "DEPLOYED"}, 0.7, "explicit --coefficients; an existing snapshot is not used"),
    ({"coefficients": "DEPLOYED", "resume": False}, 0.7, "explicit --coefficients"),
    ({"resume": False}, None, "the estimator's reference constants"),  # the shipped fit is for K = 7, not 4
])
def test_explicit_coefficients_win_and_the_block_says_which(pair, tmp_path, files, kw, slope, source):
    kw = {k: str(files[1]) if v == "DEPLOYED" else v for k, v in kw.items()}
    state = build_state(serve_config(pair, tmp_path, **kw), target=pair[2], draft=pair[3])
    est = state.make_engine().policy.estimator
    if slope is not None:
        assert est.slope == slope
    else:
        assert est.slope not in (0.61, 0.7)
    lines = dict(ln.strip().split("  ", 1) for ln in state.startup.splitlines()[1:])
    assert source in lines["coefficients"]
    assert lines["device"].strip() == "cpu, float32" and lines["K"].strip() == "4"
    assert lines["policy"].strip().startswith("adaptive-stop, estimator online_logistic, refit every 100 steps")
    assert lines["cost table"].strip() == "roofline:cpu:1.5b"
    assert "concurrency 4, queue 8, max_len 192, max_tokens 120" in lines["limits"]
    assert "+ draft" in lines["models"] and "(model drafter)" in lines["models"]


def test_target_only_block(pair, tmp_path):
    state = build_state(serve_config(pair, tmp_path, draft="none"), target=pair[2])
    assert "target only" in state.startup and "coefficients" not in state.startup


def test_access_log_one_line_per_request(pair, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="avkit.serve.access"), \
            running_server(pair, tmp_path, log_requests=True) as (url, _):
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 3,
                                                       "temperature": 0})
        n = r.json()["usage"]["completion_tokens"]
        httpx.get(url + "/v1/nothing")
        with httpx.stream("POST", url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 3,
                                                                 "temperature": 0, "stream": True}) as s:
            list(s.iter_lines())
    lines = [r.getMessage() for r in caplog.records if r.name == "avkit.serve.access"]
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"POST /v1/completions 200 prompt_tokens=1 completion_tokens={n} ")
    assert lines[1].startswith("GET /v1/nothing 404 prompt_tokens=0 completion_tokens=0 ")
    assert lines[2].startswith(f"POST /v1/completions 200 prompt_tokens=1 completion_tokens={n} ")
    assert all(ln.endswith("s") for ln in lines)


def test_no_access_log_by_default(pair, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="avkit.serve.access"), running_server(pair, tmp_path) as (url, _):
        httpx.get(url + "/health")
    assert not [r for r in caplog.records if r.name == "avkit.serve.access"]
