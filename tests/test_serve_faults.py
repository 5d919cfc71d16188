"""`avkit serve` as a process under a real client load with everything going wrong at once (issue 15):
an unwritable snapshot dir, a --record directory that becomes unwritable after start, clients that
disconnect mid-stream, a queue overflow, SIGTERM mid-load.

Contract: every request is answered (200 with a finish and [DONE], or 429, or 503 while draining),
none is lost or duplicated (response ids unique), the server's /metrics request counters equal what
the clients saw, /health says `degraded` with the reasons, and SIGTERM finishes the streams in
flight and exits 0 with no traceback, saying in one line how many trace rows it could not write.
Bounded: the tiny random pair, short completions, a few seconds of load.
"""

from __future__ import annotations

import asyncio
import collections
import json
import signal

import httpx

from serve_support import metrics, serve_process, wait_for
from test_serve_failures import unwritable_dir


async def _one(c: httpx.AsyncClient, body: dict, *, leave_after: int | None = None) -> dict:
    """One request; streams are read to [DONE] (or left after `leave_after` chunks)."""
    async with c.stream("POST", "/v1/completions", json=body) as r:
        out = {"status": r.status_code, "ids": set(), "finish": None, "done": False, "left": False}
        if r.status_code != 200:
            out["error"] = json.loads(await r.aread())["error"]
            return out
        if not body.get("stream"):
            data = json.loads(await r.aread())
            out.update(ids={data["id"]}, finish=data["choices"][0]["finish_reason"], done=True)
            return out
        chunks = 0
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                out["done"] = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                out["ids"].add(chunk["id"])
                out["finish"] = chunk["choices"][0]["finish_reason"] or out["finish"]
                chunks += 1
                if leave_after is not None and chunks >= leave_after:
                    out["left"] = True
                    return out  # the client goes away mid-stream
        return out


def _check_answered(results: list[dict]) -> None:
    for r in results:
        assert r["status"] in (200, 429, 503), r
        if r["status"] == 200 and not r["left"]:
            assert r["done"] and r["finish"] in ("stop", "length"), r
        if r["status"] != 200:
            assert r["error"]["message"] and r["error"]["type"] in ("rate_limit_error", "unavailable_error"), r
    ids = [i for r in results for i in r["ids"]]
    assert all(len(r["ids"]) == 1 for r in results if r["status"] == 200), "one response id per request"
    assert len(ids) == len(set(ids)), "a response id was served twice"


def test_serve_under_load_with_failing_disks_disconnects_overflow_and_sigterm(pair, tmp_path):
    record_dir = tmp_path / "rec"
    snap_dir = unwritable_dir(tmp_path / "snapdir")
    record_dir.mkdir()
    args = ["--snapshot", str(snap_dir / "snap.json"), "--snapshot-every", "1", "--refit-interval", "2",
            "--record", str(record_dir / "t.parquet"), "--max-tokens-limit", "64", "--max-concurrency", "2",
            "--queue-size", "3", "--grace-period", "30"]
    with serve_process(pair, *args) as (proc, url):
        record_dir.rename(tmp_path / "rec_gone")  # --record was writable at start; now it is not
        unwritable_dir(record_dir)

        # Load: 14 at once against 2 running + 3 queued -> some 429s; 4 streams leave after their first chunk.
        body = {"model": "tiny", "prompt": "def f(x):", "max_tokens": 24, "temperature": 1.0}
        stream = {**body, "stream": True}

        async def overload():
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                jobs = [_one(c, body) for _ in range(5)] + [_one(c, stream) for _ in range(5)] + \
                       [_one(c, stream, leave_after=1) for _ in range(4)]
                return await asyncio.gather(*jobs)

        results = asyncio.run(overload())
        _check_answered(results)
        seen = collections.Counter(r["status"] for r in results)
        assert seen[429] >= 1 and seen[200] >= 5, seen
        assert wait_for(lambda: httpx.get(url + "/health").json()["running"] == 0)
        health = httpx.get(url + "/health")
        assert health.status_code == 200 and health.json()["status"] == "degraded", health.text
        assert "snapshot" in health.json()["reasons"]
        m = metrics(url)
        served = {int(dict(k)["status"]): v for (name, k), v in m.items()
                  if name == "avkit_requests_total" and dict(k)["endpoint"] == "/v1/completions"}
        assert served == {s: float(n) for s, n in seen.items()}, (served, seen)
        assert m[("avkit_side_write_failures_total", (("kind", "snapshot"),))] >= 1
        rows = m[("avkit_trace_rows_total", ())]
        assert rows > 0

        # SIGTERM while 4 streams are in flight (2 decoding, 2 queued): all four finish, later requests 503.
        async def drain():
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                jobs = [asyncio.ensure_future(_one(c, {**stream, "temperature": 0})) for _ in range(4)]
                await asyncio.sleep(0.3)
                proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)
                try:
                    late = await _one(c, body)
                except httpx.TransportError:  # the listener may be closed already
                    late = {"status": 503, "ids": set(), "left": False,
                            "error": {"message": "closed", "type": "unavailable_error"}}
                return await asyncio.gather(*jobs), late

        in_flight, late = asyncio.run(drain())
        _check_answered([*in_flight, late])
        assert [r["status"] for r in in_flight] == [200] * 4 and all(r["done"] for r in in_flight)
        assert late["status"] == 503
        assert proc.wait(timeout=60) == 0
    err = proc.stderr.read()
    assert "Traceback" not in err, err[-3000:]
    assert err.count("snapshot write failed") == 1, err[-3000:]  # logged once per kind
    lost = [ln for ln in err.splitlines() if "rows were never written" in ln]
    assert len(lost) == 1 and f"--record {record_dir}/t.parquet" in lost[0], err[-3000:]
    unwritten, total = (int(x) for x in lost[0].split("; ")[1].split(" rows")[0].split(" of "))
    assert total >= rows and unwritten == total  # nothing reached the disk, and the line says so
