"""Prometheus metrics of one server, in its own registry (docs/runtime.md, "Serving")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_BUDGET_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class _AtScrape:
    """A collector whose families `families()` yields at each scrape."""

    def __init__(self, families: Callable[[], Any]):
        self.collect = families


def _estimator_families(coefficients: Callable[[], dict[str, Any] | None]):
    """Slope, intercepts and refit count of the last published coefficients (none before the first)."""
    c = coefficients()
    if c is None:
        return
    yield GaugeMetricFamily("avkit_estimator_slope", "shared slope of the online estimator", value=float(c["slope"]))
    inter = GaugeMetricFamily("avkit_estimator_intercept", "intercept per draft position", labels=["position"])
    for i, b in enumerate(c["intercepts"]):
        inter.add_metric([str(i)], float(b))
    yield inter
    yield CounterMetricFamily("avkit_refits", "online refit rounds completed since start", value=float(c.get("refits", 0)))


_CACHE_PER_TREE = {  # avkit_suffix_cache_{what}{tree=global|local} <- memory()["{tree}_{what}"]
    "tokens": "tokens held in the suffix cache trees", "nodes": "suffix trie nodes",
    "bytes": "estimated bytes of the suffix trie nodes (NODE_BYTES per node)"}
_CACHE_GLOBAL = {  # avkit_suffix_cache_{what} <- memory()[key]
    "bytes_per_token": ("bytes_per_cached_token", "estimated bytes per token cached in the global tree"),
    "budget_tokens": ("budget_tokens", "global tree budget in tokens (0: none)"),
    "responses": ("global_responses", "responses held in the global tree")}


def _suffix_cache_families(memory: Callable[[], dict[str, float]]):
    """The shared suffix cache's `memory()` (plain int reads: safe beside the engine thread)."""
    m = memory()
    for what, help_text in _CACHE_PER_TREE.items():
        fam = GaugeMetricFamily(f"avkit_suffix_cache_{what}", help_text, labels=["tree"])
        for tree in ("global", "local"):
            fam.add_metric([tree], float(m[f"{tree}_{what}"]))
        yield fam
    for what, (key, help_text) in _CACHE_GLOBAL.items():
        yield GaugeMetricFamily(f"avkit_suffix_cache_{what}", help_text, value=float(m[key]))
    yield CounterMetricFamily("avkit_suffix_cache_evicted_responses", "responses evicted from the global tree",
                              value=float(m["evicted_responses"]))


class ServeMetrics:
    """Every metric `/metrics` exposes; thread-safe (prometheus_client locks internally)."""

    def __init__(self, k: int, coefficients: Callable[[], dict[str, Any] | None] = lambda: None):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("avkit_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("avkit_prompt_tokens", "prompt tokens admitted", registry=r)
        self.generation_tokens = Counter("avkit_generation_tokens", "tokens generated", registry=r)
        self.drafted, self.verified, self.accepted = (
            Counter(f"avkit_{what}", f"draft slots {what}, by position and drafter", ["position", "drafter"], registry=r)
            for what in ("drafted", "verified", "accepted"))
        self.verify_budget = Histogram("avkit_verify_budget", "drafts verified per engine step",
                                       buckets=_BUDGET_BUCKETS, registry=r)
        self.step_time_ratio = Histogram(
            "avkit_spec_decode_step_time_actual_over_predicted", "engine step wall time over the cost model's "
            "prediction for its shape (adaptive policy; the learned model once it has refit)",
            buckets=(0.5, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, float("inf")), registry=r)
        self.step_seconds = Histogram("avkit_step_seconds", "engine step wall time",
                                      buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft_seconds = Histogram("avkit_time_to_first_token_seconds", "admission to first token",
                                      buckets=_LATENCY_BUCKETS, registry=r)
        self.latency_seconds = Histogram("avkit_request_seconds", "admission to last token",
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("avkit_queue_depth", "requests admitted but waiting for a slot", registry=r)
        self.running = Gauge("avkit_running_requests", "requests decoding in the engine", registry=r)
        self.engine_errors = Counter("avkit_engine_errors", "engine steps that raised", registry=r)
        self.side_write_failures = Counter("avkit_side_write_failures", "failed side writes by kind "
                                           "(snapshot, trace); requests are unaffected", ["kind"], registry=r)
        self.trace_rows = Counter("avkit_trace_rows", "trace rows produced for --record", registry=r)
        self.trace_rows_unwritten = Gauge("avkit_trace_rows_unwritten", "--record rows held in memory, "
                                          "not yet on disk", registry=r)
        r.register(_AtScrape(lambda: _estimator_families(coefficients)))
        for i in range(k):  # expose every position of the model drafter from the start, at zero
            for c in (self.drafted, self.verified, self.accepted):
                c.labels(position=str(i), drafter="model")

    def watch_suffix_cache(self, memory: Callable[[], dict[str, float]]) -> None:
        """Expose a suffix cache's `memory()` (avkit/hvd/suffix_cache.py) at every scrape."""
        self.registry.register(_AtScrape(lambda: _suffix_cache_families(memory)))

    def observe_rows(self, columns: dict[str, np.ndarray]) -> None:
        """One engine step's trace rows (runtime/trace_rows.py) -> per-position counters and the verify-budget
        histogram."""
        pos = np.asarray(columns["position"]).astype(np.int64)  # [N]
        if pos.size == 0:
            return
        verified = np.asarray(columns["verified"]).astype(bool)  # [N]
        accepted = np.ma.filled(columns["accepted"], False).astype(bool) & verified  # [N] (null: censored)
        kinds = np.asarray(columns["drafter"], dtype=object)  # [N]
        n = int(pos.max()) + 1
        for kind in set(kinds.tolist()):
            rows = kinds == kind  # [N]
            for counter, mask in ((self.drafted, rows), (self.verified, rows & verified),
                                  (self.accepted, rows & accepted)):
                counts = np.bincount(pos, weights=mask, minlength=n)  # [n] slots per position
                for i in np.flatnonzero(counts):
                    counter.labels(position=str(i), drafter=str(kind)).inc(float(counts[i]))
        self.verify_budget.observe(float(verified.sum()))

    def render(self) -> bytes:
        return generate_latest(self.registry)
