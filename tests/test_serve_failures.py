"""Failures inside `avkit serve` (issue 15 items 1 and 6): side writes that fail, a cancel that
arrives while a request is in transit, an engine thread that dies, a step that hangs at shutdown.
The real engine with the tiny random pair; failures are injected by wrapping one real call."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import httpx

from avkit.config import SamplingConfig
from avkit.runtime.request import Request
from avkit.scheduling.policy import FullVerification
from avkit.scheduling.spec import POLICIES
from avkit.serve.engine_loop import EngineLoop
from avkit.serve.server import build_state
from avkit.serve.side_writes import SideWrites
from serve_support import metrics, running_server, serve_config, wait_for


def unwritable_dir(path):
    """A directory path nothing can be written under, for root too (root ignores mode bits): a file
    stands where the directory should be, so creating it or anything in it fails (FileExistsError,
    NotADirectoryError)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a directory")
    return path


def test_side_writes_back_off_log_once_and_recover(caplog):
    now = [0.0]
    sw = SideWrites(clock=lambda: now[0])
    calls = []

    def failing():
        calls.append(now[0])
        raise PermissionError(13, "Permission denied", "/secret/path/snap.json")

    with caplog.at_level(logging.WARNING, logger="avkit.serve"):
        for t in range(0, 20):  # one attempt per second of fake time
            now[0] = float(t)
            sw.run("snapshot", failing)
    assert calls == [0.0, 1.0, 3.0, 7.0, 15.0]  # backoff 1, 2, 4, 8 s
    assert sw.reasons() == {"snapshot": "PermissionError: Permission denied"}  # no path in /health
    failed = [r for r in caplog.records if "snapshot write failed" in r.getMessage()]
    assert len(failed) == 1 and "/secret/path" in failed[0].getMessage()  # the log has the detail
    assert not sw.run("snapshot", lambda: None)  # still backing off
    assert sw.run("snapshot", lambda: None, force=True) and sw.reasons() == {}
    assert any("recovered" in r.getMessage() for r in caplog.records)


def _submit(loop: EngineLoop, rid: str, prompt, n: int):
    aloop = asyncio.new_event_loop()
    [handle] = loop.submit_all([Request(rid, prompt, SamplingConfig(temperature=0.0, max_new_tokens=n))], aloop)
    return handle, aloop


def _events(handle, aloop, timeout=30.0):
    """Every event posted to the handle (runs its event loop until the final one)."""
    async def drain():
        out = []
        while not (out and out[-1].finished):
            out.append(await asyncio.wait_for(handle.events.get(), timeout))
        return out

    return aloop.run_until_complete(drain())


def test_a_cancel_while_the_request_is_in_transit_is_not_lost(pair, tmp_path):
    """The cancel arrives after `_pending.popleft()`, while the engine's `add_request` runs: the request must
    not decode a token. Injected deterministically from inside the engine's `add_request`."""
    state = build_state(serve_config(pair, tmp_path), target=pair[2], draft=pair[3])
    loop = state.engine_loop
    real_add = loop._engine.add_request
    seen = {}

    def add_request(req):
        loop.cancel(req.request_id)  # the client leaves exactly now
        seen["cancelled_in_transit"] = req.request_id in loop._cancels
        real_add(req)

    loop._engine.add_request = add_request
    loop.start()
    try:
        prompt = pair[2].tokenizer.encode("The quick brown fox")
        handle, _aloop = _submit(loop, "r1", prompt, 100)
        assert wait_for(lambda: loop.num_running == 0 and "cancelled_in_transit" in seen)
        assert seen["cancelled_in_transit"]
        time.sleep(0.2)
        assert handle.events.qsize() == 0 and loop._engine.running == {} and loop._engine.waiting == {}
        assert loop._engine.stats.steps == 0  # never decoded a token
    finally:
        loop.shutdown(grace_s=0.0)


class _FailingStep(FullVerification):
    name = "failing_step"

    def num_verify(self, batch, load):
        raise RuntimeError("injected step failure")


def test_engine_thread_death_fails_everyone_with_503_and_health_says_so(pair, tmp_path, monkeypatch):
    """A step fails, and building the fresh engine fails too: the thread dies. Running and queued requests
    get a 503 at once, later ones a 503 at submit, /health turns 503 `failed`."""
    monkeypatch.setitem(POLICIES._entries, "failing_step", _FailingStep)
    state = build_state(serve_config(pair, tmp_path, policy="failing_step", max_concurrency=1), target=pair[2],
                        draft=pair[3])

    def no_more_engines():
        raise MemoryError("injected: no memory for a fresh engine")

    state.engine_loop._make_engine = no_more_engines
    from avkit.serve.server import serve_in_thread

    with serve_in_thread(state) as url:
        async def three():
            async with httpx.AsyncClient(base_url=url, timeout=30) as c:
                body = {"model": "tiny", "prompt": "x", "max_tokens": 8}
                return await asyncio.gather(*[c.post("/v1/completions", json=body) for _ in range(3)])

        codes = sorted(r.status_code for r in asyncio.run(three()))
        assert codes in ([500, 503, 503], [500, 500, 503]), codes  # the failing batch 500, the queued 503
        h = httpx.get(url + "/health")
        assert h.status_code == 503 and h.json()["status"] == "failed" and "MemoryError" in h.text
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
        assert "injected" not in r.text


class _HangingStep(FullVerification):
    name = "hanging_step"
    release = threading.Event()

    def num_verify(self, batch, load):
        _HangingStep.release.wait(20)
        return super().num_verify(batch, load)


def test_shutdown_joins_with_a_timeout(pair, tmp_path, monkeypatch):
    monkeypatch.setitem(POLICIES._entries, "hanging_step", _HangingStep)
    state = build_state(serve_config(pair, tmp_path, policy="hanging_step"), target=pair[2], draft=pair[3])
    loop = state.engine_loop
    loop.start()
    handle, aloop = _submit(loop, "r1", [5, 6, 7], 4)
    assert wait_for(lambda: loop.num_running == 1)
    t0 = time.monotonic()
    loop.shutdown(grace_s=0.2, join_s=0.5)
    assert time.monotonic() - t0 < 3.0  # the step still hangs; shutdown did not wait for it
    assert _events(handle, aloop)[-1].finish_reason == "abort"
    _HangingStep.release.set()


def test_unwritable_snapshot_degrades_health_and_never_fails_a_request(pair, tmp_path):
    import openai  # lazy: heavy, imported by the tests that use it
    snap_dir = unwritable_dir(tmp_path / "state")
    with running_server(pair, tmp_path, snapshot=str(snap_dir / "snap.json"), refit_interval=1, snapshot_every=1,
                        draft_gate=False) as (url, state):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for _ in range(4):  # ~each step refits, each refit would snapshot
            out = client.completions.create(model="tiny", prompt="def f(x):", max_tokens=16, temperature=0)
            assert out.usage.completion_tokens >= 1
        h = httpx.get(url + "/health")
        assert h.status_code == 200 and h.json()["status"] == "degraded", h.text
        # the staged write refuses a parent that is not a directory (its message holds the path: not shown)
        assert h.json()["reasons"]["snapshot"] == "ConfigError"
        assert str(tmp_path) not in h.text
        m = metrics(url)
        assert m[("avkit_side_write_failures_total", (("kind", "snapshot"),))] >= 1
        assert not state.engine_loop.dead
        snap_dir.unlink()  # the disk comes back: the next due write succeeds and health recovers
        assert wait_for(lambda: (client.completions.create(model="tiny", prompt="x", max_tokens=8, temperature=0)
                                 and httpx.get(url + "/health").json()["status"] == "ok"), timeout=30)
    assert (snap_dir / "snap.json").is_file()


def test_record_path_lost_mid_run_keeps_rows_in_memory_and_writes_them_later(pair, tmp_path, caplog):
    import openai  # lazy: heavy, imported by the tests that use it
    record_dir = tmp_path / "rec"
    record_dir.mkdir()
    with running_server(pair, tmp_path, record=str(record_dir / "t.parquet"), record_flush_s=0.0,
                        draft_gate=False) as (url, _state):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        record_dir.rename(tmp_path / "rec_moved")  # the directory vanishes under the server
        unwritable_dir(record_dir)
        for _ in range(3):
            assert client.completions.create(model="tiny", prompt="x", max_tokens=12, temperature=0).usage
        h = httpx.get(url + "/health").json()
        assert h["status"] == "degraded" and "trace" in h["reasons"], h
        m = metrics(url)
        rows = m[("avkit_trace_rows_total", ())]
        assert rows > 0 and m[("avkit_trace_rows_unwritten", ())] == rows
        record_dir.unlink()
        record_dir.mkdir()  # back: the rows held in memory go out at the next flush or at close
    from avkit.trace.reader import read_traces

    assert len(read_traces([record_dir / "t.parquet"])) == rows
