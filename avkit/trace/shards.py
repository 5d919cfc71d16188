"""A command's TRACE arguments -> trace files (files, directories, globs; none: the shipped traces), and the check
that shards belong together (one model pair). The rules: docs/traces.md, "Which files a TRACE argument names"."""

from __future__ import annotations

import glob
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from avkit.config import DEFAULT_TRACE_GLOB
from avkit.config.fields import shipped_roots
from avkit.errors import ConfigError, TraceError
from avkit.trace.reader import check_schema, no_repeats, trace_metadata

# Metadata that every shard of one fit must share: the model pair (ids and weight hashes); K may differ.
AGREE = ("avkit.target", "avkit.target_sha256", "avkit.draft", "avkit.draft_sha256")
COMPANIONS = (".generations.parquet",)  # tables that sit beside a trace and are not traces
NOT_TRACES = ("trajectory.parquet",)


def _is_trace_name(p: Path) -> bool:
    return p.suffix == ".parquet" and not p.name.endswith(COMPANIONS) and p.name not in NOT_TRACES


def _expand(spec: Path) -> list[Path]:
    if spec.is_file():
        return [spec]
    if spec.is_dir():
        found, none = [p for p in spec.iterdir() if p.is_file()], "directory holds no trace files (*.parquet)"
    elif glob.has_magic(str(spec)):
        found, none = [Path(p) for p in glob.glob(str(spec), recursive=True)], "glob matches no trace files"
    else:
        raise TraceError(f"{spec}: no such trace file, directory or glob match")
    found = sorted(p for p in found if _is_trace_name(p))
    if not found:
        raise TraceError(f"TRACE {spec}: {none}")
    return found


def resolve_shards(specs: Iterable[str | Path]) -> list[Path]:
    """Files, directories and globs -> trace files, in the order given (a repeat is an error)."""
    out = [p for spec in ([specs] if isinstance(specs, (str, Path)) else specs) for p in _expand(Path(spec))]
    if not out:
        raise TraceError("no trace files given")
    no_repeats(out)  # a replica counted twice would weigh double
    return out


def shipped_traces(roots: tuple[Path, ...] | None = None) -> list[Path]:
    """The shipped traces: `traces/*.parquet` under the working directory, else beside the package."""
    for root in roots or shipped_roots():
        found = sorted(p for p in root.glob(DEFAULT_TRACE_GLOB) if _is_trace_name(p))
        if found:
            return found
    raise ConfigError(f"no TRACE given and no shipped traces match {DEFAULT_TRACE_GLOB} yet; "
                      "record some with `avkit record` or pass trace files")


def trace_files(specs: Iterable[str | Path] | None) -> list[Path]:
    """A command's TRACE arguments -> trace files (`resolve_shards`; none given: the shipped traces)."""
    return resolve_shards(specs) if specs else shipped_traces()


@dataclass(frozen=True)
class ShardSet:
    """Trace files checked to belong to one fit (same schema family, K and model pair)."""

    paths: tuple[Path, ...]  # [S] shard files, in the order given
    meta: dict  # the first shard's `avkit.*` metadata


def check_shards(specs: Iterable[str | Path]) -> ShardSet:
    """Resolve `specs`, check every footer against the schema and the shards against each other."""
    paths, metas = resolve_shards(specs), []
    for path in paths:
        check_schema(path)
        metas.append(meta := trace_metadata(path))
        for key in AGREE:
            mine, theirs = meta.get(key, "<missing>"), metas[0].get(key, "<missing>")
            if mine != theirs:
                raise TraceError(f"shard {path}: {key} is {mine!r} but {paths[0]} (the first shard) has "
                                 f"{theirs!r}; one shard set is one model pair")
    return ShardSet(tuple(paths), metas[0])


__all__ = ["AGREE", "ShardSet", "check_shards", "resolve_shards", "shipped_traces", "trace_files"]
