"""Staged outputs: all of a command's output files and directories are committed together, or none.

Glossary:
  reserve   `file(path)` / `directory(path)` before the work: the final path must not be the wrong
            kind (a directory where a file goes, or the reverse) and its folder must be writable;
            an empty temp is created beside it at once, so an unwritable path fails in one line
            before minutes of work, not after
  write     the work writes to the temps (same folder as the final path, so the rename is atomic)
  commit    every temp is renamed over its final path (a directory replaces the old directory),
            with SIGINT/SIGTERM held back until all renames are done
  abort     any exception (KeyboardInterrupt included) removes the temps and the folders the
            reservation created; the previous outputs are left exactly as they were
Files get the mode of a plain `open()` (0666 minus the umask), not the 0600 of `mkstemp`.

    with StagedOutputs() as outputs:
        tmp = outputs.file("reports/simulate.parquet", "--out")   # before the work
        ...                                                       # the work
        df.write_parquet(tmp)                                     # committed at the end of `with`

One file alone: `with staged_file(path) as tmp: ...` (fsync=True where a crash must never leave a
torn file: server snapshots, trace flushes), or `write_json_atomic(path, obj)`. Every atomic write
of avkit goes through this module.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from avkit.errors import ConfigError


@dataclass
class _Entry:
    final: Path
    tmp: Path
    is_dir: bool


@contextmanager
def deferred_signals():
    """Hold SIGINT/SIGTERM back while the body runs (they are delivered when it ends).

    In the main thread the Python handlers are swapped for one that only notes the signal: blocking the
    signals there is not enough, since `kill` aims them at the process and any other thread (an OpenMP or
    polars worker) may take one, trip Python's flag and make the main thread raise KeyboardInterrupt at its
    next check inside the body (mid-abort, leaving a temp behind). The first noted signal is raised again
    at the end, to the restored handler. Other threads cannot set handlers: they block the signals."""
    sigs = (signal.SIGINT, signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread():
        old = signal.pthread_sigmask(signal.SIG_BLOCK, set(sigs))
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return
    noted: list[int] = []
    previous = {s: signal.signal(s, lambda number, frame: noted.append(number)) for s in sigs}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if noted:
            signal.raise_signal(noted[0])


def _os_error(name: str, path: Path, e: OSError) -> ConfigError:
    return ConfigError(f"{name} {path}: cannot write there ({e.strerror or e})")


class StagedOutputs:
    """Reserve outputs before the work, write them to temps, rename them all at the end (see module doc)."""

    def __init__(self) -> None:
        self._entries: dict[Path, _Entry] = {}
        self._made_dirs: list[Path] = []  # folders created by reservations, removed again on abort
        self._mask = os.umask(0)  # read by setting it: set it back at once
        os.umask(self._mask)

    # ---- reservation ----
    def _parent(self, final: Path, name: str) -> None:
        missing = [p for p in (final.parent, *final.parent.parents) if not p.exists()]
        for p in missing:
            if p.is_symlink() or (p.parent.exists() and not p.parent.is_dir()):
                raise ConfigError(f"{name} {final}: {p.parent} is not a directory")
        try:
            for p in reversed(missing):
                p.mkdir()
                self._made_dirs.append(p)
        except OSError as e:
            raise _os_error(name, final, e) from None
        if not final.parent.is_dir():
            raise ConfigError(f"{name} {final}: {final.parent} is not a directory")

    def file(self, path, name: str = "--out") -> Path:
        """The temp file to write for final `path` (reserved now; the same temp on a second call)."""
        return self._reserve(Path(path).expanduser(), name, is_dir=False)

    def directory(self, path, name: str = "--out") -> Path:
        """An empty temp directory that replaces directory `path` as a whole at commit."""
        return self._reserve(Path(path).expanduser(), name, is_dir=True)

    def _reserve(self, final: Path, name: str, is_dir: bool) -> Path:
        if final in self._entries:
            return self._entries[final].tmp
        if is_dir and final.exists() and not final.is_dir():
            raise ConfigError(f"{name} {final}: exists and is not a directory")
        if not is_dir and final.is_dir():
            raise ConfigError(f"{name} {final}: is a directory, expected a file path")
        with deferred_signals():  # created and registered together: an interrupt never orphans a temp
            self._parent(final, name)
            try:
                where = {"dir": final.parent, "prefix": f".{final.name}.", "suffix": ".tmp"}
                if is_dir:
                    tmp = tempfile.mkdtemp(**where)
                else:
                    fd, tmp = tempfile.mkstemp(**where)
                    os.close(fd)
                self._entries[final] = _Entry(final, Path(tmp), is_dir)
                os.chmod(tmp, (0o777 if is_dir else 0o666) & ~self._mask)
            except OSError as e:
                raise _os_error(name, final, e) from None
        return Path(tmp)

    def discard(self, path) -> None:
        """Give up a reserved output that this run turned out not to produce (the old one stays)."""
        entry = self._entries.pop(Path(path).expanduser(), None)
        if entry is not None:
            _remove(entry.tmp)

    # ---- the end ----
    def commit(self) -> list[Path]:
        """Rename every temp over its final path; -> the final paths."""
        with deferred_signals():
            for e in self._entries.values():
                if not e.is_dir:
                    os.replace(e.tmp, e.final)
                    continue
                old = e.final.with_name(f".{e.final.name}.{os.getpid()}.old")
                if e.final.exists():
                    os.replace(e.final, old)
                os.replace(e.tmp, e.final)
                shutil.rmtree(old, ignore_errors=True)
        done = [e.final for e in self._entries.values()]
        self._entries.clear()
        self._made_dirs.clear()
        return done

    def abort(self) -> None:
        """Remove every temp and every folder the reservations created; finals are untouched."""
        with deferred_signals():
            for e in self._entries.values():
                _remove(e.tmp)
            for d in reversed(self._made_dirs):
                try:
                    d.rmdir()
                except OSError:
                    pass
        self._entries.clear()
        self._made_dirs.clear()

    def __enter__(self) -> StagedOutputs:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def check_writable(path, name: str = "--out", *, directory: bool = False) -> Path:
    """Fail now, in one line, if `path` could not be written later (wrong kind, unwritable folder).

    Leaves nothing behind: the probe's temp and any folder it had to create are removed again.
    """
    probe = StagedOutputs()
    try:
        (probe.directory if directory else probe.file)(path, name)
    finally:
        probe.abort()
    return Path(path).expanduser()


@contextmanager
def staged_file(path, name: str = "--out", *, fsync: bool = False) -> Iterator[Path]:
    """One output file written atomically: the body writes the yielded temp beside `path`, which is
    renamed over `path` when the body ends (flushed to disk first with `fsync`), or removed if it raises."""
    with StagedOutputs() as outputs:
        tmp = outputs.file(path, name)
        yield tmp
        if fsync:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())


def write_json_atomic(path, obj: Any, name: str = "--out") -> Path:
    """`obj` as indented JSON at `path`, fsync'd and renamed into place: a crash never leaves a torn file."""
    with staged_file(path, name, fsync=True) as tmp:
        tmp.write_text(json.dumps(obj, indent=2))
    return Path(path).expanduser()


__all__ = ["StagedOutputs", "check_writable", "deferred_signals", "staged_file", "write_json_atomic"]
