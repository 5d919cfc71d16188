"""Bounded load test of `avkit serve` on loopback (bench/README.md: usage): a real uvicorn server in this process
around a tiny random pair, N concurrent streaming clients x R requests, checked against serve's robustness
contract (every request completes or gets a clean 429 with Retry-After, none lost or duplicated, the server's
counters equal the clients', healthy and idle afterwards; exit 1 otherwise) -> bench/results/serve_load.md.
`--cold-start`: a fresh `avkit serve` process, time to ready and first request vs the rest -> serve_cold_start.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import torch
from prometheus_client.parser import text_string_to_metric_families

from avkit.config import EngineConfig, EstimatorConfig, HttpConfig, ModelsConfig, ServeConfig
from avkit.markdown import md_table
from avkit.models import load
from avkit.models.testing import write_tiny_model
from avkit.serve.server import build_state, serve_in_thread
from common import csv, header, write  # bench/ is on sys.path when run as a script


@dataclass
class Result:
    client: int
    status: int
    ttft_s: float | None = None
    latency_s: float | None = None
    completion_tokens: int = 0
    response_id: str = ""
    finish_reason: str | None = None
    done: bool = False
    retry_after: str | None = None
    error: str = ""


async def one_request(c: httpx.AsyncClient, client: int, body: dict) -> Result:
    t0 = time.perf_counter()
    try:
        async with c.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return Result(client, r.status_code, retry_after=r.headers.get("retry-after"),
                              error=r.text[:200])
            res = Result(client, 200)
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    res.done = True
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    res.error = chunk["error"]["message"]
                    continue
                res.response_id = chunk["id"]
                if chunk.get("usage"):
                    res.completion_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk["choices"]:
                    if choice["text"] and res.ttft_s is None:
                        res.ttft_s = time.perf_counter() - t0
                    res.finish_reason = choice["finish_reason"] or res.finish_reason
            res.latency_s = time.perf_counter() - t0
            return res
    except httpx.HTTPError as e:  # a lost request: the contract says this never happens
        return Result(client, -1, error=f"{type(e).__name__}: {e}")


async def run_clients(url: str, args, prompts: list[str]) -> tuple[list[Result], float]:
    limits = httpx.Limits(max_connections=args.clients + 8)
    async with httpx.AsyncClient(base_url=url, timeout=args.request_timeout, limits=limits) as c:
        async def client(i: int) -> list[Result]:
            out = []
            for j in range(args.requests):
                body = {"model": "tiny", "prompt": prompts[(i + j) % len(prompts)],
                        "max_tokens": args.max_tokens, "temperature": args.temperature, "seed": i * 1000 + j,
                        "stream": True, "stream_options": {"include_usage": True}}
                out.append(await one_request(c, i, body))
            return out

        t0 = time.perf_counter()
        per_client = await asyncio.wait_for(asyncio.gather(*[client(i) for i in range(args.clients)]),
                                            timeout=args.time_limit)
        return [r for rs in per_client for r in rs], time.perf_counter() - t0


def pct(xs, q) -> str:
    return f"{np.percentile(xs, q) * 1e3:.0f}" if len(xs) else "-"


def metrics(url: str) -> list:
    """The server's /metrics samples (prometheus_client's parser: the format's one reader)."""
    return [s for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text) for s in fam.samples]


def check(results: list[Result], args, url: str) -> list[str]:
    """The robustness contract; returns the list of violations (empty = pass)."""
    bad = []
    if len(results) != args.clients * args.requests:
        bad.append(f"{len(results)} results for {args.clients * args.requests} requests")
    for r in results:
        if r.status == 200 and not (r.done and r.finish_reason and not r.error):
            bad.append(f"client {r.client}: incomplete 200 response ({r.error or 'no [DONE]/finish_reason'})")
        elif r.status == 429 and r.retry_after is None:
            bad.append(f"client {r.client}: 429 without Retry-After")
        elif r.status not in (200, 429):
            bad.append(f"client {r.client}: status {r.status} {r.error}")
    ids = [r.response_id for r in results if r.status == 200]
    if len(set(ids)) != len(ids):
        bad.append(f"duplicate response ids: {len(ids) - len(set(ids))}")
    seen = {s.labels["status"]: s.value for s in metrics(url)
            if s.name == "avkit_requests_total" and s.labels.get("endpoint") == "/v1/completions"}
    for code in ("200", "429"):
        client_n = sum(r.status == int(code) for r in results)
        if seen.get(code, 0) != client_n:
            bad.append(f"server counted {seen.get(code, 0)} x {code}, clients saw {client_n}")
    health = httpx.get(url + "/health").json()
    if health != {"status": "ok", "running": 0, "queued": 0}:
        bad.append(f"unhealthy afterwards: {health}")
    return bad


def section(results: list[Result], wall_s: float, violations: list[str], cfg, stats: dict) -> list[str]:
    ok = [r for r in results if r.status == 200]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    lat = [r.latency_s for r in ok]
    tokens = sum(r.completion_tokens for r in ok)
    per_req = [r.completion_tokens / r.latency_s for r in ok if r.latency_s]
    steps = stats.get("avkit_step_seconds_count", 0)
    busy = stats.get("avkit_step_seconds_sum", 0.0)
    return [
        (f"## max_concurrency {cfg.engine.concurrency}, queue_size {cfg.http.queue_size} "
         f"(admits {cfg.engine.concurrency + cfg.http.queue_size} at once)"), "",
        md_table(("requests", "completed (200)", "rejected (429)", "lost / other", "duplicates", "wall s", "tokens",
                  "tokens/s"),
                 [(str(len(results)), str(len(ok)), str(sum(r.status == 429 for r in results)),
                   str(sum(r.status not in (200, 429) for r in results)), str(len(ok) - len({r.response_id for r in ok})),
                   f"{wall_s:.1f}", str(tokens), f"{tokens / wall_s:.0f}")], [False] * 8), "",
        md_table(("latency (ms)", "p50", "p90", "p99", "max"),
                 [(name, *(pct(x, q) for q in (50, 90, 99, 100))) for name, x in
                  (("time to first token", ttft), ("end to end", lat))], [False] * 5), "",
        (f"Per-request decode speed: median {np.median(per_req):.1f} tokens/s. Engine: {steps:.0f} steps, "
         f"mean {1e3 * busy / max(steps, 1):.1f} ms/step, busy {100 * busy / wall_s:.0f}% of the wall time; "
         f"{stats.get('avkit_refits_total', 0):.0f} online refits. Time to first token includes the wait "
         "for a decoding slot.") if per_req else "", "",
        "Contract: " + ("PASS: every request completed or got a clean 429 with Retry-After; no request "
                        "lost or duplicated; server counters match the clients; healthy and idle afterwards."
                        if not violations else "FAIL\n\n" + "\n".join(f"- {v}" for v in violations)), "",
    ]


def setup_lines(args, cfg) -> list[str]:
    return [
        (f"Load average after the runs {os.getloadavg()[0]:.1f} (shared with other jobs: absolute numbers are a floor, not a "
         "capacity figure).  "),
        (f"Model: tiny random Qwen2 pair (vocab {args.vocab}, hidden 64, 2 layers; draft = target weights x "
         f"0.25/0.3), fp32 CPU, torch threads {args.threads}.  "),
        (f"Each client sends {args.requests} streaming completions one after another (T={args.temperature}, "
         f"max_tokens {args.max_tokens}, seeded); K={cfg.engine.k}, policy {cfg.policy} ({cfg.adaptive.estimator}, refit "
         f"every {cfg.online.refit_interval} steps)."), "",
    ]


PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "import numpy as np",
           "class Stack:", "Hello, world! How are you today?"]


def run_scenario(cfg, models, args) -> tuple[list[str], list[str]]:
    """One server configuration under the full client load: (report section, violations)."""
    state = build_state(cfg, target=models[0], draft=models[1])
    with serve_in_thread(state) as url:
        results, wall_s = asyncio.run(run_clients(url, args, PROMPTS))
        violations = check(results, args, url)
        stats = {s.name: s.value for s in metrics(url)
                 if s.name in ("avkit_step_seconds_sum", "avkit_step_seconds_count", "avkit_refits_total")}
    return section(results, wall_s, violations, cfg, stats), violations


def cold_start(args, target: str, draft: str, ext: Path) -> list[str]:
    """A fresh-install `avkit serve` process: when it answers, and its first request against the rest."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    models = [] if target == "default" else ["--target", target, "--draft", draft or "none", "--max-len", "512",
                                              "--k", str(args.k)]
    cmd = [sys.executable, "-m", "avkit", "serve", "--port", str(port), *models,
           "--snapshot", str(ext.parent / "snap.json"), "--log-level", "warning"]
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "OMP_NUM_THREADS": str(args.threads)}
    url, t0 = f"http://127.0.0.1:{port}", time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port_s = ready_s = None
        while ready_s is None:
            if proc.poll() is not None or time.perf_counter() - t0 > args.time_limit:
                raise SystemExit(f"avkit serve exited or never became ready:\n{proc.communicate()[1][-2000:]}")
            try:
                code = httpx.get(url + "/health", timeout=5).status_code
                port_s = port_s or time.perf_counter() - t0
                ready_s = time.perf_counter() - t0 if code == 200 else None
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        name = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        latency, tokens = [], []
        for i in range(args.requests):  # one at a time: each request's latency is its own
            body = {"model": name, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": args.max_tokens,
                    "temperature": args.temperature, "seed": i}
            t = time.perf_counter()
            r = httpx.post(url + "/v1/completions", json=body, timeout=args.request_timeout)
            r.raise_for_status()
            latency.append(time.perf_counter() - t)
            tokens.append(r.json()["usage"]["completion_tokens"])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    per_token = np.array(latency) * 1e3 / np.maximum(tokens, 1)  # [requests] ms per generated token
    rest = per_token[1:]
    return [f"Model: {'the default real pair' if target == 'default' else 'tiny random Qwen2 pair'}, "
            f"{args.requests} completions of {args.max_tokens} tokens (T={args.temperature}), one at a time; "
            f"torch threads {args.threads}; load {os.getloadavg()[0]:.1f} after the run.", "",
            "Latency per generated token (requests may stop early at an end token), in ms:", "",
            md_table(("port open s", "/health 200 s", "request 1", "requests 2.. median", "p90", "last", "1st / median",
                      "request 1: ms, tokens"),
                     [(f"{port_s:.1f}", f"{ready_s:.1f}", f"{per_token[0]:.1f}", f"{np.median(rest):.1f}",
                       f"{np.percentile(rest, 90):.1f}", f"{rest[-1]:.1f}", f"{per_token[0] / np.median(rest):.2f}",
                       f"{latency[0] * 1e3:.0f}, {tokens[0]}")], [True] * 7 + [False]), ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=3, help="requests per client, sequential")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-concurrency", type=int, default=16)
    ap.add_argument("--queue-sizes", default="32,64", type=csv(int), help="one run per queue size (comma separated)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--refit-interval", type=int, default=20, help="engine steps per online refit")
    ap.add_argument("--vocab", type=int, default=384)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--target", default="", help="model dir/id (default: a tiny random model)")
    ap.add_argument("--draft", default="")
    ap.add_argument("--time-limit", type=float, default=600.0, help="wall-clock bound of each run, s")
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--out", default="", help="default: bench/results/serve_load.md (--cold-start: serve_cold_start.md)")
    ap.add_argument("--cold-start", action="store_true", help="a fresh-install server process: first request vs the rest")
    args = ap.parse_args()
    kind = "from a fresh install: first request vs the rest" if args.cold_start else "load test (loopback)"
    head = header(f"`avkit serve` {kind}")  # the load before the runs

    lines, failed = [], False
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = args.target, args.draft
        if not target:
            target = str(write_tiny_model(Path(tmp) / "target", vocab=args.vocab, seed=0, init_std=0.3))
            draft = str(write_tiny_model(Path(tmp) / "draft", vocab=args.vocab, seed=0, init_std=0.25))
        if args.cold_start:
            lines = cold_start(args, target, draft, Path(tmp) / "torch_extensions")
        else:
            torch.set_num_threads(args.threads)
            models = load(target), load(draft) if draft else None
        for queue_size in [] if args.cold_start else args.queue_sizes:
            cfg = ServeConfig(models=ModelsConfig(target=target, draft=draft or "none"),
                              engine=EngineConfig(k=args.k, concurrency=args.max_concurrency, max_len=512),
                              online=EstimatorConfig(refit_interval=args.refit_interval),
                              http=HttpConfig(served_model_name="tiny", queue_size=queue_size, grace_period=5.0),
                              snapshot=str(Path(tmp) / "snap.json"), resume=False,
                              max_new_tokens=max(args.max_tokens, 16), default_max_tokens=16)
            section_lines, violations = run_scenario(cfg, models, args)
            lines += (setup_lines(args, cfg) if not lines else []) + section_lines
            failed |= bool(violations)
    text = head + "\n".join(lines)
    write({args.out or f"bench/results/{'serve_cold_start' if args.cold_start else 'serve_load'}.md": text})
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
