"""What a report reads: an `avkit fit` directory (coefficients.json and scores.json required,
trajectory.parquet optional), the traces behind it (coefficients.json `trained_on.traces`, or given) and
the results files of `RESULTS`. An absent input leaves `None` and a note; its sections say so in the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from avkit.config import ReportConfig, SimulateConfig
from avkit.errors import ConfigError, DataError, first_line
from avkit.estimators.coefficients import load_coefficients
from avkit.fit import FitResult
from avkit.jsonsafe import read_json
from avkit.provenance import trace_mismatch, trace_records
from avkit.report.traces import TraceSummary, summarize
from avkit.sim.replay import read_inputs

SCORE_KEYS = ("feature", "lossless", "estimator", "scope", "auc", "log_loss", "ece", "n")
SIM_COLUMNS = ("concurrency", "policy", "throughput_tok_s", "per_request_tok_s", "vs_best_fixed")
HVD_KEYS = ("router", "dataset", "cycles_per_1k", "precision", "recall", "speedup_vs_model")
HVD_INFO = ("requests", "rows", "k", "high_payoff", "split_requests", "cost")  # what hvd/markdown.py's text reads
TUNE_KEYS = ("avkit_tune", "concurrency", "cells", "schedule", "infeasible", "idle", "vllm", "trtllm", "notes")


@dataclass
class FitOutputs(FitResult):
    """An `avkit fit` output directory read back; `trajectory` None when the file is absent."""

    dir: Path


@dataclass
class ReportInputs:
    fit: FitOutputs
    traces: list[Path] = field(default_factory=list)
    summary: TraceSummary | None = None  # what the sections show of `traces` (None: not at hand)
    sim: pl.DataFrame | None = None
    hvd: dict | None = None
    tune: dict | None = None
    notes: dict[str, str] = field(default_factory=dict)  # input -> why it is missing
    sources: dict[str, str] = field(default_factory=dict)  # input -> where it came from (shown in the report)
    records: dict[str, dict | None] = field(default_factory=dict)  # fit / sim / hvd -> provenance record
    warnings: dict[str, list[str]] = field(default_factory=dict)  # fit / sim / hvd -> stale or mismatched input


def load_fit_dir(path) -> FitOutputs:
    """Read an `avkit fit` output directory; raise ConfigError/DataError naming the file."""
    d = Path(path)
    if not d.is_dir():
        raise ConfigError(f"FIT_DIR {d}: not a directory")
    for name in ("coefficients.json", "scores.json"):
        if not (d / name).is_file():
            raise ConfigError(f"FIT_DIR {d}: no {name} (write one with `avkit fit --out {d}`)")
    coefficients = load_coefficients(d / "coefficients.json")  # the one validated loader
    scores = read_json(d / "scores.json", error=DataError)
    if "estimator" not in coefficients:
        raise DataError(f"{d / 'coefficients.json'}: missing key 'estimator'")
    if not isinstance(scores, list) or not scores:
        raise DataError(f"{d / 'scores.json'}: expected a non-empty list of score rows")
    for i, row in enumerate(scores):
        if not isinstance(row, dict):
            raise DataError(f"{d / 'scores.json'}: row {i} is not an object: {row!r}")
        missing = [k for k in SCORE_KEYS if k not in row]
        if missing:
            raise DataError(f"{d / 'scores.json'}: row {i} lacks {missing}")
    traj = d / "trajectory.parquet"
    return FitOutputs(coefficients, scores, _parquet(traj) if traj.is_file() else None, d)


def _parquet(p: Path, option: str = "") -> pl.DataFrame:
    try:
        return pl.read_parquet(p)
    except (OSError, pl.exceptions.PolarsError) as e:
        raise DataError(f"{option}{p}: not a readable Parquet file: {first_line(e)}") from None


def load_sim(p: Path) -> pl.DataFrame:
    df = _parquet(p, "--sim ")
    missing = [c for c in SIM_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(f"--sim {p}: missing column(s) {missing} (expected `avkit simulate` results)")
    return df


def load_hvd(p: Path) -> dict:
    p = p / "hvd_metrics.json" if p.is_dir() else p
    blob = read_json(p, "--hvd", DataError)
    rows = blob.get("metrics") if isinstance(blob, dict) else None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and all(k in r for k in HVD_KEYS)
                                                         for r in rows):
        raise DataError(f"--hvd {p}: expected `avkit hvd` hvd_metrics.json with metrics rows {list(HVD_KEYS)}")
    if not isinstance(blob.get("info"), dict) or any(k not in blob["info"] for k in HVD_INFO):
        raise DataError(f"--hvd {p}: `info` lacks some of {list(HVD_INFO)} (written by an older avkit: "
                        "rerun `avkit hvd`)")
    return blob


def load_tune(p: Path) -> dict:
    blob = read_json(p, "--tune", DataError)
    missing = [k for k in TUNE_KEYS if not isinstance(blob, dict) or k not in blob]
    if missing:
        raise DataError(f"--tune {p}: missing key(s) {missing} (expected an `avkit tune` result)")
    return blob


# results file -> (its loader, its name in warnings, its provenance record, how to add it when it is absent)
RESULTS = {"sim": (load_sim, "The simulation results", lambda p, _: read_inputs(p),
                   "run `avkit simulate` and pass its results with --sim (or let `avkit report` simulate the traces)"),
           "hvd": (load_hvd, "The HVD results", lambda _, blob: blob["info"].get("inputs"),
                   "run `avkit hvd` to add the hybrid-drafting results"),
           "tune": (load_tune, "The tuning results", lambda _, blob: blob.get("inputs"),
                    "run `avkit tune` to add the recommended schedule")}


def load_inputs(fit: FitOutputs, traces=None, config: ReportConfig | None = None, **given) -> ReportInputs:
    """Gather everything a report reads. `traces` default to the ones the fit was trained on. `given`: sim,
    hvd and tune paths, each of which must exist; one not given is read from `config`'s path when that exists
    (no config: not read). With `config.engine` streaming the traces are summed out of core."""
    notes: dict[str, str] = {}
    paths = [Path(p) for p in (traces or fit.coefficients.get("trained_on", {}).get("traces", []))]
    found = [p for p in paths if p.is_file()]
    inputs = ReportInputs(fit, found, notes=notes)
    if found:
        inputs.summary = summarize(found, fit.coefficients, (config or ReportConfig()).bins,
                                   config.streaming() if config else None)
    else:
        notes["traces"] = ("the traces the fit was trained on are not at hand"
                           + (f" ({', '.join(map(str, paths))})" if paths else "") + "; pass them as TRACE")
    inputs.records["fit"] = fit.coefficients.get("trained_on", {}).get("inputs")
    for name, (load, _, record, hint) in RESULTS.items():
        path = given.get(name) or (getattr(config, name) if config else None)
        p = None if path is None else Path(path).expanduser()
        if p is None:
            notes[name] = hint
        elif not p.exists():
            if given.get(name):
                raise ConfigError(f"--{name} {p}: no such file")
            notes[name] = f"no {p} yet: {hint}"
        else:
            setattr(inputs, name, load(p))
            inputs.sources[name] = str(path)
            inputs.records[name] = record(p, getattr(inputs, name))
    check_records(inputs)
    return inputs


def check_records(inputs: ReportInputs) -> None:
    """Name every input made from other traces than the report's (by content hash, from its provenance record),
    or made by an avkit that recorded none."""
    records, reference = inputs.records, trace_records(inputs.traces)
    what = {"fit": f"The fit ({inputs.fit.dir})",
            **{name: f"{RESULTS[name][1]} ({inputs.sources[name]})" for name in records if name != "fit"}}
    for name, record in records.items():
        warn = inputs.warnings.setdefault(name, [])
        if record is None:
            warn.append(f"{what[name]} records no inputs (written by an older avkit): which traces and settings "
                        "made it cannot be checked; rerun the command that wrote it.")
        elif mismatch := trace_mismatch(record, reference, what[name]):
            warn.append(mismatch)
    sim_traces = {t["sha256"] for t in (records.get("sim") or {}).get("traces", [])}
    if sim_traces and reference and sim_traces < {t["sha256"] for t in reference}:  # fewer traces: other mix
        inputs.warnings["sim"].append(f"The simulation results replay {len(sim_traces)} of this report's "
                                      f"{len(reference)} traces; its throughputs are for that subset.")
    sim_cost = ((records.get("sim") or {}).get("cost") or {}).get("spec")
    if sim_cost and sim_cost != SimulateConfig().cost:
        inputs.warnings["sim"].append(f"Simulated with cost model {sim_cost}, not avkit simulate's default "
                                      f"{SimulateConfig().cost}: the throughputs below are for that device/model.")
