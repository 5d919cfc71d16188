"""Calibration health on vLLM's /metrics: the `vllm.stat_logger_plugins` entry point, in vLLM's API server
process; reads the worker's health file (health.py) and exports `avkit:spec_decode_*` in vLLM's metric style
(docs/vllm.md, "the plugin"). Inert unless AVKIT_VLLM_METRICS is set and the plugin made a run directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import Counter, Gauge
from vllm.v1.metrics.loggers import StatLoggerBase

from avkit.engines.vllm.health import read_state
from avkit.engines.vllm.plugin import RUN_DIR, PluginEnv

PREFIX = "avkit:spec_decode_"
_METRICS: dict = {}  # name -> collector, registered once per process (prometheus_client's registry is global)


def _collector(kind, name: str, doc: str, labels: tuple[str, ...]):
    if name not in _METRICS:
        _METRICS[name] = kind(PREFIX + name, doc, list(labels))
    return _METRICS[name]


class AvkitStatLogger(StatLoggerBase):
    """Exports the worker's calibration health (module docstring) for one engine."""

    def __init__(self, vllm_config, engine_index: int = 0):
        self.on = PluginEnv.read().metrics and RUN_DIR in os.environ
        if not self.on:
            return
        self.run_dir = Path(os.environ[RUN_DIR])
        self.labels = {"model_name": str(vllm_config.model_config.served_model_name),
                       "engine": str(engine_index)}
        pos = ("model_name", "engine", "position")
        base = ("model_name", "engine")
        self.labelled = _collector(Counter, "labelled_slots", "Labelled draft slots per position.", pos)
        self.accepted = _collector(Counter, "accepted_slots", "Accepted draft slots per position.", pos)
        self.predicted = _collector(Gauge, "predicted_acceptance", "Rolling mean predicted acceptance.", pos)
        self.observed = _collector(Gauge, "observed_acceptance", "Rolling observed acceptance.", pos)
        self.gauges = {key: _collector(Gauge, name, doc, base) for key, name, doc in (
            ("ece", "calibration_ece", "Rolling expected calibration error of the acceptance predictor."),
            ("brier", "brier", "Rolling Brier score of the acceptance predictor."),
            ("expected_accepted_per_step", "expected_accepted_per_step",
             "Rolling predicted accepted tokens per request-step."),
            ("actual_accepted_per_step", "actual_accepted_per_step", "Rolling accepted tokens per request-step."))}
        self.seen_steps = -1
        self.counted: dict[str, list[float]] = {}

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        if not self.on:
            return
        state = read_state(self.run_dir)
        if state is None or state["steps"] == self.seen_steps:
            return
        self.seen_steps = state["steps"]
        total, rolling = state["total"], state["rolling"]
        for name, counter in (("labelled", self.labelled), ("accepted", self.accepted)):
            before = self.counted.get(name, [0.0] * len(total[name]))
            for j, (now, was) in enumerate(zip(total[name], before)):
                if now > was:
                    counter.labels(**self.labels, position=str(j)).inc(now - was)
            self.counted[name] = list(total[name])
        for j, (p, o) in enumerate(zip(rolling["predicted"], rolling["observed"])):
            self.predicted.labels(**self.labels, position=str(j)).set(p)
            self.observed.labels(**self.labels, position=str(j)).set(o)
        for key, gauge in self.gauges.items():
            gauge.labels(**self.labels).set(rolling[key])

    def log_engine_initialized(self):
        pass
