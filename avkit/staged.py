"""Staged outputs: all of a command's output files and directories are committed together, or none.

  reserve   `file(path)` / `directory(path)` before the work: the final path must not be the wrong kind and
            its folder must be writable; an empty temp is created beside it at once (an unwritable path fails
            in one line before minutes of work, not after)
  commit    every temp is renamed over its final path (a directory replaces the old one), with SIGINT/SIGTERM
            held back until all renames are done
  abort     any exception (KeyboardInterrupt included) removes the temps and the folders the reservation made;
            the previous outputs are left exactly as they were
Files get the mode of a plain `open()` (0666 minus the umask), not the 0600 of `mkstemp`. One file alone:
`staged_file(path)` or `write_json_atomic(path, obj)`. Every atomic write of avkit goes through this module.
A command's first SIGINT/SIGTERM raises KeyboardInterrupt (so: abort) once: `one_interrupt`.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from avkit.errors import ConfigError
from avkit.jsonsafe import dumps


@contextmanager
def one_interrupt(*, always: bool = False, busy: str = ""):
    """The first SIGINT or SIGTERM raises KeyboardInterrupt (outputs are aborted, nothing half-written stays, a
    kernel build's compiler is stopped); later ones while that unwinds are ignored (`busy`, when given, printed
    for each), so a burst of Ctrl-C never ends in a traceback. Yields `signalled()`: whether one was taken here.

    Main thread only. A signal is taken over where it has its default handler (a SIGINT ignored since the shell
    started us stays ignored); with `always` also where it is ignored or handled (a recording started in the
    background, or inside the CLI's). On exit, once interrupted (here, or inside by a handler that then ignores
    SIGINT) SIGINT stays ignored: the process is ending and later SIGINTs must not break its shutdown; SIGTERM
    gets its handler back (an ignored SIGTERM would be inherited by every child process started later).
    `avkit serve` hands both to uvicorn once its port is open."""
    state = {"raised": False}

    def interrupt(signum, frame):
        if not state["raised"]:
            state["raised"] = True
            raise KeyboardInterrupt(signal.Signals(signum).name)
        if busy:
            print(busy, file=sys.stderr, flush=True)

    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    main = threading.current_thread() is threading.main_thread()
    old = {s: signal.getsignal(s) for s, d in defaults.items() if main and (always or signal.getsignal(s) is d)}
    for s in old:
        signal.signal(s, interrupt)
    try:
        yield lambda: state["raised"]
    finally:
        for s, handler in old.items():
            ending = s == signal.SIGINT and (state["raised"] or signal.getsignal(s) is signal.SIG_IGN)
            signal.signal(s, signal.SIG_IGN if ending else handler)


@contextmanager
def deferred_signals():
    """Hold SIGINT/SIGTERM back while the body runs; the first one is raised again when it ends.

    The main thread swaps the handlers for one that only notes the signal (blocking is not enough: any
    thread, an OpenMP or polars worker, may take a process signal and make the main thread raise inside the
    body); other threads cannot set handlers and block the signals."""
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
        self._entries: dict[Path, Path] = {}  # final -> its temp (a file, or a directory replacing one)
        self._made_dirs: list[Path] = []  # folders created by reservations, removed again on abort
        self._mask = os.umask(0)  # read by setting it: set it back at once
        os.umask(self._mask)

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
            return self._entries[final]
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
                self._entries[final] = Path(tmp)
                os.chmod(tmp, (0o777 if is_dir else 0o666) & ~self._mask)
            except OSError as e:
                raise _os_error(name, final, e) from None
        return Path(tmp)

    def discard(self, path) -> None:
        """Give up a reserved output that this run turned out not to produce (the old one stays)."""
        tmp = self._entries.pop(Path(path).expanduser(), None)
        if tmp is not None:
            _remove(tmp)

    def commit(self) -> list[Path]:
        """Rename every temp over its final path; -> the final paths."""
        with deferred_signals():
            for final, tmp in self._entries.items():
                old = final.with_name(f".{final.name}.{os.getpid()}.old")
                is_dir = tmp.is_dir()
                if is_dir and final.exists():
                    os.replace(final, old)
                os.replace(tmp, final)
                if is_dir:
                    shutil.rmtree(old, ignore_errors=True)
        done = list(self._entries)
        self._entries.clear()
        self._made_dirs.clear()
        return done

    def abort(self) -> None:
        """Remove every temp and every folder the reservations created; finals are untouched."""
        with deferred_signals():
            for tmp in self._entries.values():
                _remove(tmp)
            for d in reversed(self._made_dirs):
                with suppress(OSError):
                    d.rmdir()
        self._entries.clear()
        self._made_dirs.clear()

    def __enter__(self) -> StagedOutputs:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        (self.commit if exc_type is None else self.abort)()
        return False


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def check_writable(path, name: str = "--out") -> Path:
    """Fail now, in one line, if file `path` could not be written later (wrong kind, unwritable folder); the
    probe's temp and any folder it created are removed again."""
    with StagedOutputs() as probe:  # (an exception aborts it too)
        probe.file(path, name)
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
    """`obj` as indented JSON (`jsonsafe.dumps`: NaN as null) at `path`, fsync'd and renamed into place: a crash
    never leaves a torn file."""
    with staged_file(path, name, fsync=True) as tmp:
        tmp.write_text(dumps(obj, indent=2))
    return Path(path).expanduser()


__all__ = ["StagedOutputs", "check_writable", "deferred_signals", "staged_file", "write_json_atomic"]
