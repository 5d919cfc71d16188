"""What a results file was made from: a record written into the file (its fields and where each results file
stores it: docs/traces.md, "Results record their inputs"), shown and checked by `avkit report`."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import os
from pathlib import Path

from avkit import __version__
from avkit.validate import option_text

INPUTS_KEY = "avkit.inputs"  # Parquet metadata key of the record


def files_sha256(paths) -> str:
    """SHA-256 of the files' bytes, concatenated in the order given (one file: its own hash)."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


@functools.lru_cache(maxsize=256)
def _sha256(path: str, size: int, mtime_ns: int) -> str:  # size and mtime: the cache key only
    return files_sha256([path])


def file_sha256(path) -> str:
    """sha256 of a file's bytes (cached per path, size and mtime: a report hashes each trace once)."""
    st = os.stat(path)
    return _sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def trace_records(paths) -> list[dict]:
    """[{path, sha256, bytes}] for each trace file."""
    return [{"path": str(p), "sha256": file_sha256(p), "bytes": os.path.getsize(p)} for p in paths]


def inputs_record(command: str, traces=(), **settings) -> dict:
    """The record a results file stores (docs/traces.md)."""
    return {"command": command, "avkit_version": __version__,
            "written": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "traces": trace_records(traces), **settings}


def cost_record(cost, spec: str) -> dict:
    """What a cost model was: the spec given, its source, device and models, and a profiled table's content
    hash (a re-profiled table under the same name is told apart)."""
    meta = cost.meta
    out = {"spec": spec, **{k: meta.get(k, "") for k in ("source", "device", "target", "draft")}}
    if meta.get("path") and Path(meta["path"]).is_file():
        out["sha256"] = file_sha256(meta["path"])[:16]
    return out


def describe(record: dict | None) -> str:
    """One line for a report: command, version, time, traces (short hashes), the cost model, then the
    settings (a command's `args` as the options that set them: `--concurrency 1,4 --no-draft-gate`)."""
    if not record:
        return "records no inputs (written before avkit recorded them): its traces and settings are unknown"
    traces = ", ".join(f"{Path(t['path']).name} [{t['sha256'][:8]}]" for t in record.get("traces", []))
    skip = {"command", "avkit_version", "written", "traces"}
    parts = [_setting(k, v) for k, v in record.items() if k not in skip and v not in ("", None, [], {})]
    when = record.get("written", "?").replace("T", " ").rstrip("Z")
    return (f"{record.get('command', '?')} (avkit {record.get('avkit_version', '?')}, {when} UTC) on "
            f"{traces or 'no trace files'}" + "".join(f"; {p}" for p in parts if p))


def _setting(key: str, v) -> str:
    if key == "cost" and isinstance(v, dict):  # cost_record
        models = " + ".join(m for m in (v.get("target"), v.get("draft")) if m)
        what = ", ".join(x for x in (v.get("source"), v.get("device"), models) if x)
        return f"cost {v.get('spec', '?')}" + (f" ({what})" if what else "")
    if key == "args" and isinstance(v, dict):  # a command's options, by name
        return " ".join(option_text(name, x) for name, x in v.items() if x not in ("", None, [], ()))
    if isinstance(v, dict):
        return f"{key} " + ", ".join(f"{k} {x}" for k, x in v.items() if x not in ("", None))
    return f"{key} " + (", ".join(map(str, v)) if isinstance(v, list | tuple) else str(v))


def trace_mismatch(record: dict | None, reference: list[dict], what: str) -> str:
    """'' when every trace `record` was made from is one of `reference` (by content hash); else one
    sentence naming the stale or foreign traces. `reference`: trace_records of the report's traces."""
    if not record or not reference:
        return ""
    now, known = {Path(t["path"]).name: t["sha256"] for t in reference}, {t["sha256"] for t in reference}
    off = [t for t in record.get("traces", []) if t["sha256"] not in known]
    stale = [f"{n} (sha256 {t['sha256'][:8]} then, {now[n][:8]} now)" for t in off if (n := Path(t["path"]).name) in now]
    other = [n for t in off if (n := Path(t["path"]).name) not in now]
    parts = ([f"stale: {', '.join(stale)} changed since"] if stale else []) + (
        [f"made from other traces than this report's: {', '.join(other)}"] if other else [])
    return f"{what} does not match this report's traces: " + "; ".join(parts) + "." if parts else ""


__all__ = ["INPUTS_KEY", "cost_record", "describe", "file_sha256", "files_sha256", "inputs_record", "trace_mismatch",
           "trace_records"]
