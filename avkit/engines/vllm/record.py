"""avkit's side of `record --engine vllm` (docs/vllm.md, "How it runs"): checks before vLLM starts, the requests,
offline.py in a work directory beside --out, then the commit by avkit/record/files.py's rules; `--resume`
appends the rows of the requests not yet finished to the kept ones through avkit's writers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from avkit.config import RecordConfig
from avkit.engines.vllm.driver import (check_vllm_version, child_env, engine_spec, exit_error, hf_dir, run_offline,
                                       vllm_python)
from avkit.errors import AvkitError, ConfigError
from avkit.models.registry import weights_sha256
from avkit.models.tokenizer import Tokenizer
from avkit.record.files import RecordFiles, check_resume, finished_requests, open_tables
from avkit.record.requests import PromptQueue
from avkit.record.stats import AcceptanceStats
from avkit.staged import StagedOutputs
from avkit.trace.schema import generations_path
from avkit.trace.writer import partial_path


@dataclass(frozen=True)
class VllmModel:
    """A model as the trace's metadata sees it when vLLM runs it: a HF directory, its tokenizer and hash."""

    path: Path
    tokenizer: Tokenizer
    model_id: str
    sha256: str = ""
    dtype_name: str = ""


def check(config: RecordConfig) -> tuple[str, Path, Path]:
    """Every check before vLLM starts; -> (vLLM's Python, target directory, draft directory)."""
    python = vllm_python(config.vllm_python)
    check_vllm_version(python)
    probe = subprocess.run([python, "-c", "import pyarrow, numpy"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        raise ConfigError(f"--vllm-python {python}: avkit's plugin cannot write traces there (pyarrow or numpy "
                          "missing): pip install avkit into vLLM's venv")
    if config.decoding.k < 1 or not config.models.has_draft:
        raise ConfigError("--engine vllm records draft slots: give a --draft and -k >= 1")
    if config.models.drafter != "model":
        raise ConfigError(f"--drafter {config.models.drafter}: --engine vllm runs vLLM's draft_model proposer only")
    return python, hf_dir(config.models.target, "--target"), hf_dir(config.models.draft, "--draft")


def requests(config: RecordConfig, tokenizer: Tokenizer, done: dict | None = None) -> tuple[list[dict], int]:
    """offline.py's requests: every prompt's first turn not in `done` (a resumed file's finished requests), in the
    queue's order; -> (requests, prompts skipped for exceeding --max-prompt-tokens)."""
    queue, out, followups = PromptQueue(config, tokenizer, done), [], 0
    stops = set(tokenizer.eos_token_ids)
    while (turn := queue.pop()) is not None:
        r, s = turn.request, turn.request.sampling
        out.append({"request_id": r.request_id, "dataset": r.dataset, "prompt_ids": list(r.prompt_ids),
                    "temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_new_tokens, "seed": s.seed,
                    "stop_token_ids": sorted(set(r.stop_token_ids) | stops)})
        followups += bool(turn.prompt.followups)
    if followups:
        print(f"avkit record: --engine vllm records first turns only ({followups} prompts have follow-up turns, "
              "not asked)", file=sys.stderr)
    return out, queue.skipped_long


def _commit(tables: list[tuple[Path, Path]]) -> None:
    """The work directory's tables over their destinations together, trace first (files.py), by staged.py."""
    with StagedOutputs() as outputs:
        for src, dest in tables:
            if src.exists():
                os.replace(src, outputs.file(dest, "--out"))


def record_vllm(config: RecordConfig, files: RecordFiles, metadata, *, progress: bool = True, console=None,
                run_id: str | None = None) -> dict:
    """Record through vLLM (module docstring); `metadata(config, target, draft)` is the recorder's file metadata.
    -> the fields of avkit.record.RecordResult."""
    python, target_dir, draft_dir = check(config)
    target, draft = (VllmModel(d, Tokenizer.from_dir(d), name, weights_sha256(d), config.models.dtype)
                     for d, name in ((target_dir, config.models.target), (draft_dir, config.models.draft)))
    meta = {**metadata(config, target, draft), "avkit.vllm.draft_sample_method": config.vllm_draft_sampling}
    del meta["avkit.engine"], meta["avkit.dtype"]  # the plugin's: `vllm X.Y.Z` and the dtype vLLM runs
    check_resume(files, meta)
    src = files.generations_source
    done = finished_requests(pq.read_table(src)) if config.resume and src is not None and src.exists() else {}
    reqs, skipped_long = requests(config, target.tokenizer, done)
    if not reqs:
        raise ConfigError(f"--dataset {', '.join(config.dataset)}: no prompt fits --max-prompt-tokens "
                          f"{config.max_prompt_tokens}")
    out = files.trace
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.vllm-", dir=out.parent))
    trace = work / out.name
    env = {**child_env(config.threads), "AVKIT_VLLM_TRACE": str(trace), "AVKIT_VLLM_META": json.dumps(meta),
           "AVKIT_VLLM_FLUSH_S": str(config.flush_interval)}
    for name in ("AVKIT_VLLM_COEFFICIENTS", "AVKIT_VLLM_METRICS", "AVKIT_VLLM_DATASET"):
        env.pop(name, None)  # this run's plugin writes the trace only
    spawned = time.time()
    tables = [(trace, files.trace), (generations_path(trace), files.generations)]
    code, lines, interrupted = None, [], False
    try:
        code, lines = run_offline(python, {**engine_spec(config, target_dir, draft_dir), "mode": "record",
                                           "requests": reqs}, env, work, progress=progress, console=console)
    except KeyboardInterrupt:
        interrupted = True
    committed = code == 0 or (interrupted and files.commit_on_interrupt())
    if not committed:
        if config.resume:
            _append(files, tables, commit=False)  # the partials hold the kept rows and this run's
        else:
            _commit([(src, partial_path(dest)) for src, dest in tables])
        if not interrupted:  # vLLM failed: its error, not an interrupt (the partials keep what was recorded)
            kept = Path(shutil.copy(work / "vllm.log", out.with_name(out.name + ".vllm.log")))
            shutil.rmtree(work, ignore_errors=True)
            raise exit_error(code, kept)
    elif not trace.exists() and not interrupted:
        shutil.rmtree(work, ignore_errors=True)
        raise AvkitError("vLLM verified no draft (no trace was written): more prompts or --max-new-tokens")
    elif config.resume:
        _append(files, tables, commit=True)
    else:
        _commit(tables)
    shutil.rmtree(work, ignore_errors=True)
    result = {key: value for line in lines for key, value in line.items()}
    if result:
        print(f"avkit record: vLLM {result['vllm']} ready {result['ready_at'] - spawned:.0f} s after its start "
              f"(imports included), generated in {result['generate_s']:.0f} s", file=sys.stderr)
    return {**_result(config, files, result, committed, run_id, done), "interrupted": interrupted,
            "skipped_long": skipped_long}


def _append(files: RecordFiles, tables: list[tuple[Path, Path]], commit: bool) -> None:
    """--resume: the source's rows of finished requests, then this run's, written over the finals (trace first),
    or to the partials only (`commit` False: files.py's rule for a run that may not replace the finals)."""
    (trace, _), (gens, _) = tables
    new_trace = pq.read_table(trace) if trace.exists() else None
    meta = {k.decode(): v.decode() for k, v in (pq.read_schema(trace).metadata or {}).items()} if new_trace else {}
    out, g, _ = open_tables(files, meta, True)
    if new_trace is not None and new_trace.num_rows:
        offset = out.next_engine_step()
        cols = {name: new_trace[name].to_pylist() for name in new_trace.column_names}
        cols["engine_step"] = [s + offset for s in cols["engine_step"]]
        out.write(cols)
    if gens.exists():
        new_gens = pq.read_table(gens)
        g.write({name: new_gens[name].to_pylist() for name in new_gens.column_names})
    for w in (out, g):  # trace first (files.py)
        if commit:
            w.close()
        else:
            w.flush()


def _result(config: RecordConfig, files: RecordFiles, result: dict, committed: bool, run_id: str | None,
            done: dict) -> dict:
    """The tables' counts (this run's: the rows of its run id, the requests not in `done`), the summary over the
    whole file, vLLM's counters."""
    where = files.trace if committed else partial_path(files.trace)
    gens_where = files.generations if committed else partial_path(files.generations)
    table = pq.read_table(where) if where.exists() else None
    stats = AcceptanceStats(config.decoding.k)
    if table is not None:
        stats.update_from_table(table)
    gens = pq.read_table(gens_where, columns=["request_id", "output_ids"]) if gens_where.exists() else None
    if gens is not None:
        gens = gens.filter(pc.invert(pc.is_in(gens["request_id"], pa.array(sorted(done), pa.string()))))
    total = table.num_rows if table is not None else 0
    if total:
        run_id = table["run_id"][-1].as_py()  # this run's rows come last
    mine = table.filter(pc.equal(table["run_id"].cast("string"), run_id)) if total else None
    rows = mine.num_rows if mine is not None else 0
    counters = result.get("counters", {})
    return {"trace_path": files.trace, "generations_path": files.generations, "run_id": run_id or "",
            "requests": gens.num_rows if gens is not None else 0, "rows": rows, "rows_total": total,
            "summary": stats.summary(),
            "engine_steps": len(pc.unique(mine["engine_step"])) if rows else 0,
            "engine_tokens": int(pc.sum(pc.list_value_length(gens["output_ids"])).as_py() or 0) if gens else 0,
            "committed": committed, "engine_counters": counters or None}
