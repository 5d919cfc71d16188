"""Runs INSIDE vLLM's venv: the offline vLLM engine of `avkit record --engine vllm` and `avkit profile --engine vllm`.

    VLLM_PYTHON -m avkit.engines.vllm.offline SPEC.json RESULT.jsonl        (started by driver.run_offline)

SPEC holds the engine (make_llm's keys) and a `mode`; RESULT gets one JSON object per line, the last one vLLM's
version, the dtype it ran, when the engine was ready (epoch s), whether cpu_fix ran and its spec-decode counters.
  record   one `LLM.generate` over every request while the plugin, registered here as vLLM registers it, writes
           the tables (AVKIT_VLLM_TRACE, _META, _FLUSH_S from the parent; engine core in this process)
  profile  `LLMEngine.step()` timed per (context, n) until `steps` steady steps (exactly n (K + 1) scheduled
           target tokens with n running), then aborted; the hooks' timing splits drafting off. One line a point.
Any failure: the traceback on stderr, exit code 1.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import signal
import sys
import time

import vllm
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind

from avkit.engines.vllm import cpu_fix, hooks, plugin


def make_llm(spec: dict) -> LLM:
    """vLLM's offline `LLM` of a spec (target, draft, k, dtype, max_model_len, max_num_seqs, seed,
    draft_sample_method, k_schedule, prefix_caching): eager, no async scheduling, one process."""
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


def counters(llm: LLM) -> dict:
    """vLLM's spec-decode counters, cumulative since start: name (without `vllm:`) -> int or [int per position]."""
    return {m.name.split(":", 1)[1]: [int(v) for v in m.values] if hasattr(m, "values") else int(getattr(m, "value", 0))
            for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode_")}


def die_with_parent() -> None:
    """Linux: SIGTERM this process when avkit dies (it runs in its own session, so Ctrl-C and a killed
    `timeout` reach only avkit; without this a SIGKILLed avkit would leave vLLM running)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent already died
            sys.exit(1)


def sampling_params(req: dict) -> SamplingParams:
    """A request of the spec -> vLLM's SamplingParams (the plugin's labels in `extra_args`)."""
    t = float(req["temperature"])
    return SamplingParams(temperature=t, top_p=float(req["top_p"]) if t > 0 else 1.0,
                          max_tokens=int(req["max_tokens"]), seed=req.get("seed"),
                          stop_token_ids=list(req.get("stop_token_ids", ())), detokenize=False,
                          extra_args={"avkit_request_id": req["request_id"], "avkit_dataset": req["dataset"]})


def record(llm: LLM, spec: dict, out) -> None:
    reqs = spec["requests"]
    t0 = time.perf_counter()
    llm.generate([TokensPrompt(prompt_token_ids=list(r["prompt_ids"])) for r in reqs],
                 [sampling_params(r) for r in reqs], use_tqdm=True)
    out.write(json.dumps({"generate_s": time.perf_counter() - t0}) + "\n")
    plugin.finish()


def profile(llm: LLM, spec: dict, out) -> None:
    """One line per point: its context, requests and the steady steps' wall and drafting times (module docstring)."""
    engine, rec, k, steps = llm.llm_engine, hooks.RECORDER, int(spec["k"]), int(spec["steps"])
    t = float(spec["temperature"])
    sp = SamplingParams(temperature=t, top_p=float(spec["top_p"]) if t > 0 else 1.0, seed=0,
                        max_tokens=int(spec["max_tokens"]), ignore_eos=True, detokenize=False,
                        output_kind=RequestOutputKind.DELTA)
    rng = random.Random(0)
    rec.take_timing()  # from here on, per step
    for context in spec["contexts"]:
        for n in spec["requests"]:
            ids = [engine.add_request(f"k{k}c{context}-n{n}-{i}", TokensPrompt(
                prompt_token_ids=[rng.randrange(spec["vocab"]) for _ in range(context)]), sp) for i in range(n)]
            steady: list[tuple[float, float]] = []
            while engine.has_unfinished_requests() and len(steady) < steps:
                running = engine.get_num_unfinished_requests()
                t0 = time.perf_counter()
                engine.step()
                step_ms = (time.perf_counter() - t0) * 1e3
                draft_ms, scheduled, _ = rec.take_timing()
                if running == n and scheduled == n * (k + 1):
                    steady.append((step_ms, draft_ms))
            engine.abort_request(ids, internal=True)  # the rest of their tokens would time nothing
            if len(steady) < steps:
                raise RuntimeError(f"avkit profile --engine vllm: {n} requests at K = {k} gave {len(steady)} steady "
                                   f"steps of {steps} (vLLM trimmed drafts or chunked the steps; try a smaller "
                                   "--context-len)")
            out.write(json.dumps({"context": context, "requests": n, "steady": steady}) + "\n")
            out.flush()


def main(spec_path: str, result_path: str) -> int:
    die_with_parent()
    spec = json.loads(open(spec_path).read())
    if spec["mode"] == "record":
        plugin.register()
    else:
        hooks.install()  # timing only: the recorder stays inactive
    llm = make_llm(spec)
    fixed = cpu_fix.install()  # after the engine: vLLM registers its CPU kernels while it starts
    ready_at = time.time()
    dtype = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    meta = json.loads(os.environ.get(plugin.META, "") or "{}")  # read when the plugin opens the trace
    os.environ[plugin.META] = json.dumps({**meta, "avkit.dtype": dtype,
                                          "avkit.vllm.cpu_expand_fix": str(fixed).lower()})
    with open(result_path, "w", buffering=1) as out:
        (record if spec["mode"] == "record" else profile)(llm, spec, out)
        out.write(json.dumps({"vllm": vllm.__version__, "dtype": dtype, "ready_at": ready_at,
                              "cpu_expand_fix": fixed, "counters": counters(llm)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
