"""The recording loop: admit requests, step the engine, write generations, flush (trace first), report.
What is committed when, and why: docs/traces.md, "Recording"."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from avkit.config import AdaptiveConfig, RecordConfig
from avkit.record.files import check_resume, open_tables, preflight
from avkit.record.requests import PromptQueue, Turn
from avkit.record.stats import AcceptanceStats
from avkit.scheduling.spec import parse_spec
from avkit.staged import one_interrupt
from avkit.trace.schema import run_metadata
from avkit.trace.writer import TraceWriter

_NEVER = 1 << 40  # row_group_rows for writers the recorder flushes itself
_BUSY = "avkit record: still saving the files, please wait"  # a signal while they are saved


@dataclass(frozen=True)
class RecordingSink:
    """A `TraceSink` that adds the run id, counts labelled slots and buffers rows into a writer."""

    writer: TraceWriter
    run_id: str
    stats: AcceptanceStats

    def emit(self, columns: dict[str, np.ndarray]) -> None:
        n = len(next(iter(columns.values()), ()))
        columns = {"run_id": np.full(n, self.run_id, dtype=object), **columns}
        self.stats.update(columns)
        self.writer.write(columns)


@dataclass(frozen=True)
class RecordResult:
    trace_path: Path
    generations_path: Path
    run_id: str
    requests: int  # requests finished in this run
    rows: int  # trace rows written in this run
    rows_total: int  # trace rows in the file (resumed + this run)
    interrupted: bool
    skipped_long: int  # prompts skipped for exceeding max_prompt_tokens
    summary: dict  # AcceptanceStats.summary() over the whole file
    engine_steps: int  # the engine's own counters for this run
    engine_tokens: int
    committed: bool = True  # False: the rows are in the .partial files, the finals were left as they were
    engine_counters: dict | None = None  # --engine vllm: vLLM's own spec-decode counters for this run


def metadata(config: RecordConfig, target, draft) -> dict[str, str]:
    """File-level metadata (schema.META_KEYS)."""
    dtype = getattr(target, "dtype_name", "") or str(target.model.dtype).removeprefix("torch.")
    return run_metadata(target, draft, k=config.decoding.k, temperature=config.sampling.temperature,
                        top_p=config.sampling.top_p, drafter=config.models.drafter, seed=config.decoding.seed,
                        datasets=list(config.dataset), policy=config.policy, dtype=dtype,
                        max_new_tokens=config.sampling.max_new_tokens, engine=config.engine)


class RecordProgress(Progress):
    """`with RecordProgress(total, stats) as p: p.requests(done, tokens)`: a live bar on a terminal, else (a log
    file) one plain line every `log_interval_s`; silent when disabled."""

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


def record(config: RecordConfig, *, target=None, draft=None, progress: bool = True, console=None,
           run_id: str | None = None) -> RecordResult:
    """Record `config.dataset` through the engine into `config.out` and its generations table (what may happen
    to existing files: avkit/record/files.py). `target`/`draft`: LoadedModels, loaded from `config` when None."""
    files = preflight(config)  # before the models load: a refused --out or resume costs nothing
    policy = verify_policy(config)  # a bad spec, schedule or cost file fails here too
    if console is not None:
        console.print(f"avkit record: {config.models.target} + {config.models.draft or 'no draft'}, "
                      f"datasets {', '.join(config.dataset)} -> {config.out}")
    if config.engine == "vllm":  # an offline vLLM in its own venv, avkit's plugin writing the tables
        from avkit.engines.vllm.record import record_vllm  # lazy: torch (the models' hashing and tokenizers)

        with one_interrupt(always=True, busy=_BUSY):
            return RecordResult(**record_vllm(config, files, metadata, progress=progress, console=console,
                                              run_id=run_id))
    import torch  # lazy: torch

    from avkit.models import load_pair  # lazy: torch
    from avkit.runtime.engine import make_engine  # lazy: torch

    if config.threads:
        torch.set_num_threads(config.threads)
    target, draft = load_pair(config.models, drafts=config.decoding.k > 0, target=target, draft=draft)
    meta = metadata(config, target, draft)
    check_resume(files, meta)
    out, gen_path = files.trace, files.generations
    run_id = run_id or f"{out.stem}-{time.strftime('%Y%m%dT%H%M%S')}-{os.urandom(2).hex()}"
    started = False  # both partials written: from here on an error keeps what was recorded in them
    with one_interrupt(always=True, busy=_BUSY):
        try:
            trace, gens, done = open_tables(files, meta, config.resume, trace_rows=config.row_group_rows,
                                            generation_rows=_NEVER)
            gens.flush()  # generations partial first: a trace partial never exists without its generations
            trace.flush()
            started = True
            stats = AcceptanceStats(max(config.decoding.k, 1))
            stats.update_from_table(trace.table())  # the resumed rows (none without --resume)
            resumed_rows = trace.rows_written
            sink = RecordingSink(trace, run_id, stats)
            queue = PromptQueue(config, target.tokenizer, done)
            # context sized for the longest admitted prompt + generation
            engine = make_engine(target, draft, config.decoding_for_run, config.models, policy=policy, sink=sink)
            engine.engine_step = trace.next_engine_step()
            finished, interrupted = _run(config, engine, sink, queue, gens, run_id, stats, progress, console)
            commit = not interrupted or files.commit_on_interrupt()
            for writer in (trace, gens):  # trace first (avkit/record/files.py)
                (writer.close if commit else writer.flush)()
            if config.cost_out and commit and policy.learner is not None:
                policy.learner.snapshot(config.cost_out)  # what the run's steps taught (temp file, renamed)
        except BaseException:
            for writer in (trace, gens) if started else ():  # trace first; the finals are untouched
                writer.keep()
            raise
    return RecordResult(out, gen_path, run_id, finished, trace.rows_written - resumed_rows, trace.rows_written,
                        interrupted, queue.skipped_long, stats.summary(), engine.stats.steps, engine.stats.tokens,
                        committed=trace.closed)


def verify_policy(config: RecordConfig):
    """The verify policy of `config.policy` (None: `full`, the engine's default), for the engine's K."""
    if config.policy == "full":
        return None
    return parse_spec(config.policy).make(k=config.decoding.k, cost=config.cost or None,
                                          coefficients=config.coefficients,
                                          adaptive=AdaptiveConfig(learn_cost=config.learn_cost))


def _run(config, engine, sink, queue, gens, run_id, stats, progress, console):
    """Drive the engine until the queue is empty; -> (requests finished, interrupted)."""
    # request -> (its turn, its output ids, when it was admitted, when each output token's step returned;
    # epoch seconds)
    active: dict[str, tuple[Turn, list[int], float, list[float]]] = {}
    finished, last_flush = 0, time.monotonic()

    def admit():
        # One new request per step: the engine prefills the prompts admitted together in one padded
        # forward (cost ~ n x longest prompt); one at a time costs the sum of prompt lengths.
        labelled = {d: stats.labelled(d) for d in stats.by_dataset}
        full = {d for d, n in labelled.items() if config.slots_per_dataset and n >= config.slots_per_dataset}
        if len(active) < config.decoding.concurrency and (turn := queue.pop(full, labelled)) is not None:
            engine.add_request(turn.request)
            active[turn.request.request_id] = (turn, [], time.time(), [])

    with RecordProgress(queue.expected(), stats, enabled=progress, console=console) as bar:
        try:
            admit()
            while active:
                new_tokens = 0
                step_out = engine.step()
                now = time.time()
                for o in step_out:
                    turn, ids, admitted, times = active[o.request_id]
                    ids.extend(o.new_token_ids)
                    times.extend([now] * len(o.new_token_ids))
                    new_tokens += len(o.new_token_ids)
                    if o.finished:
                        del active[o.request_id]
                        req = turn.request
                        gens.write({"run_id": [run_id], "request_id": [req.request_id], "dataset": [req.dataset],
                                    "prompt_ids": [list(req.prompt_ids)], "output_ids": [list(ids)],
                                    "finish_reason": [o.finish_reason or "length"], "admitted_s": [admitted],
                                    "first_token_s": [times[0] if times else None],
                                    "last_token_s": [times[-1] if times else None], "token_s": [times]})
                        queue.finished(turn, ids)
                        finished += 1
                admit()
                bar.requests(finished, new_tokens)
                if time.monotonic() - last_flush >= config.flush_interval:
                    sink.writer.flush()  # trace before generations (docs/traces.md, "Recording")
                    gens.flush()
                    last_flush = time.monotonic()
        except KeyboardInterrupt:  # the caller flushes or commits both files
            return finished, True
    return finished, False
