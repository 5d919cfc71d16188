"""Rich progress display for a recording: requests done, tokens/s, acceptance per position."""

from __future__ import annotations

import time

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from avkit.record.stats import AcceptanceStats


class RecordProgress:
    """`with RecordProgress(total, stats) as p: p.update(done, tokens)` (silent when disabled).

    On a terminal this is a live bar; otherwise (a log file) one plain line every `log_interval_s`.
    """

    def __init__(self, total: int, stats: AcceptanceStats, *, enabled: bool = True, console: Console | None = None,
                 log_interval_s: float = 30.0):
        self.stats = stats
        self.console = console or Console(stderr=True)
        self.log_every = None if (not enabled or self.console.is_terminal) else log_interval_s
        enabled = enabled and self.console.is_terminal
        self.start = self._last_log = time.monotonic()
        self.tokens = 0
        self._progress = Progress(
            TextColumn("[bold]record"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[accept]}"),
            console=self.console, disable=not enabled, transient=False,
        )
        self._task = self._progress.add_task("record", total=total, rate="", accept="")

    def __enter__(self):
        self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self._progress.__exit__(*exc)

    def update(self, done: int, new_tokens: int, total: int | None = None) -> None:
        self.tokens += new_tokens
        elapsed = max(time.monotonic() - self.start, 1e-9)
        acc = self.stats.acceptance()
        accept = "acc/pos " + " ".join("-" if np.isnan(a) else f"{a:.2f}" for a in acc)
        rate = f"{self.tokens / elapsed:.1f} tok/s  {self.stats.labelled()} labelled"
        self._progress.update(self._task, completed=done, rate=rate, accept=accept,
                              **({"total": total} if total is not None else {}))
        now = time.monotonic()
        if self.log_every is not None and now - self._last_log >= self.log_every:
            self._last_log = now
            self.console.print(f"[{time.strftime('%H:%M:%S')}] {done} requests done  {rate}  {accept}",
                               highlight=False, soft_wrap=True)
