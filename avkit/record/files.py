"""What `avkit record` may do to the files at `--out` (docs/traces.md, "Recording"): nothing is clobbered.

  final      `<out>` and its generations table `<out stem>.generations.parquet`
  partial    `<final>.partial`: the rows of a run that has not been committed (trace/writer.py)
  source     where a `--resume` starts: both partials when the trace's partial exists, else both finals
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from avkit.config import RecordConfig
from avkit.errors import ConfigError
from avkit.staged import check_writable
from avkit.trace.reader import trace_metadata
from avkit.trace.schema import generations_path
from avkit.trace.writer import GenerationWriter, TraceWriter, partial_path, resume_source, row_groups
from avkit.workloads import load_workload

# Metadata that must match for a resume: (key, what it is called on the command line, compare as float)
RESUME_KEYS = (("avkit.k", "-k", False), ("avkit.temperature", "--temperature", True),
               ("avkit.top_p", "--top-p", True), ("avkit.drafter", "--drafter", False),
               ("avkit.target", "--target", False), ("avkit.draft", "--draft", False),
               ("avkit.target_sha256", "--target (weights)", False), ("avkit.draft_sha256", "--draft (weights)", False),
               ("avkit.engine", "--engine", False))


@dataclass(frozen=True)
class RecordFiles:
    trace: Path  # final trace
    generations: Path  # final generations table
    trace_source: Path | None  # where a resume reads the trace from (None: a fresh run)
    generations_source: Path | None
    final_existed: bool  # a final trace was at `trace` when the run started

    def commit_on_interrupt(self) -> bool:
        """May an interrupted run replace the finals? Only when no rows can be lost."""
        return not self.final_existed or (self.trace_source == self.trace)


def preflight(config: RecordConfig) -> RecordFiles:
    """Every check that needs no model, before any model loads: each dataset loads, `--out` against the rules,
    the resume sources readable, the resume settings other than the models; -> the files of this run."""
    for name in config.dataset:
        load_workload(name, 1)  # an unknown name, a missing package or a bad file fails here
    out = Path(config.out)
    gens = generations_path(out)
    check_writable(out, "--out")
    existing = [p for p in (out, partial_path(out), gens, partial_path(gens)) if p.exists()]
    if existing and not (config.resume or config.overwrite):
        what = "exists" if existing[0] == out else f"{existing[0].name} exists beside it"
        raise ConfigError(f"--out {out}: {what}; pass --resume to continue it or --overwrite to "
                          "replace it (the old files stay until the new run finishes)")
    sources = (None, None)
    if config.resume:  # both partials when the trace's exists, else both finals: decided once for the pair
        sources = (resume_source(out), partial_path(gens) if partial_path(out).exists() else
                   gens if gens.exists() else None)
        for src in sources:
            if src is not None and src.exists():
                row_groups(src)  # unreadable: refused now
    files = RecordFiles(out, gens, *sources, out.exists())
    check_resume(files, {"avkit.k": str(config.decoding.k), "avkit.temperature": str(config.sampling.temperature),
                         "avkit.top_p": str(config.sampling.top_p), "avkit.drafter": config.models.drafter})
    return files


def check_resume(files: RecordFiles, meta: dict[str, str]) -> None:
    """Refuse a resume whose source was recorded with other settings (`meta`: this run's metadata)."""
    if files.trace_source is None:
        return
    old = trace_metadata(files.trace_source)
    for key, option, numeric in RESUME_KEYS:
        if key not in old or key not in meta:
            continue
        was, now = old[key], meta[key]
        if key.endswith("sha256") and not (was and now):
            continue  # a hash is only compared when both runs know it
        same = _same_float(was, now) if numeric else was == now
        if not same:
            raise ConfigError(f"--resume {files.trace_source}: recorded with {key} = {was!r}, this run has "
                              f"{now!r} ({option}); record into another --out or match the settings")


def open_tables(files: RecordFiles, meta: dict[str, str], resume: bool, *, trace_rows: int | None = None,
                generation_rows: int | None = None) -> tuple[TraceWriter, GenerationWriter, dict[str, list[int]]]:
    """Both tables' writers, resumed from the sources (both read before anything is written: a failed resume
    leaves both tables as they were; the trace keeps the requests that have a generation row), and those
    finished requests (`finished_requests`). `*_rows`: the writers' row groups."""
    gens = GenerationWriter(files.generations, meta, row_group_rows=generation_rows, resume=resume,
                            source=files.generations_source)
    done = finished_requests(gens.table())  # none without a resume
    trace = TraceWriter(files.trace, meta, row_group_rows=trace_rows, resume=resume, keep_requests=set(done),
                        source=files.trace_source)
    return trace, gens, done


def finished_requests(generations) -> dict[str, list[int]]:
    """A generations table's finished requests, which `--resume` does not ask again: request id -> output ids."""
    return dict(zip(generations["request_id"].to_pylist(), generations["output_ids"].to_pylist()))


def _same_float(a: str, b: str) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)
    except ValueError:
        return a == b


__all__ = ["RecordFiles", "check_resume", "finished_requests", "open_tables", "preflight"]
