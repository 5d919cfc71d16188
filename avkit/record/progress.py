"""Rich progress display for a recording: requests done, tokens/s, acceptance per position."""

from __future__ import annotations

import time

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from avkit.record.stats import AcceptanceStats


class RecordProgress(Progress):
    """`with RecordProgress(total, stats) as p: p.requests(done, tokens)` (silent when disabled).

    On a terminal this is a live bar; otherwise (a log file) one plain line every `log_interval_s`.
    """

    def __init__(self, total: int, stats: AcceptanceStats, *, enabled: bool = True, console: Console | None = None,
                 log_interval_s: float = 30.0):
        console = console or Console(stderr=True)
        super().__init__(TextColumn("[bold]record"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                         TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[accept]}"),
                         console=console, disable=not (enabled and console.is_terminal))
        self.stats, self.tokens = stats, 0
        self.log_every = None if (not enabled or console.is_terminal) else log_interval_s
        self.t0 = self._last_log = time.monotonic()
        self._bar = self.add_task("record", total=total, rate="", accept="")

    def requests(self, done: int, new_tokens: int) -> None:
        """`done` requests finished so far, `new_tokens` emitted since the last call."""
        self.tokens += new_tokens
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        accept = "acc/pos " + " ".join("-" if np.isnan(a) else f"{a:.2f}" for a in self.stats.acceptance())
        rate = f"{self.tokens / elapsed:.1f} tok/s  {self.stats.labelled()} labelled"
        self.update(self._bar, completed=done, rate=rate, accept=accept)
        now = time.monotonic()
        if self.log_every is not None and now - self._last_log >= self.log_every:
            self._last_log = now
            self.console.print(f"[{time.strftime('%H:%M:%S')}] {done} requests done  {rate}  {accept}",
                               highlight=False, soft_wrap=True)
