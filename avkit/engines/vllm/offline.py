"""Runs INSIDE vLLM's venv: `avkit record --engine vllm`'s offline engine, with avkit's plugin writing the tables.

    VLLM_PYTHON -m avkit.engines.vllm.offline SPEC.json RESULT.json        (started by record.py)

The parent sets the plugin's environment (AVKIT_VLLM_TRACE, AVKIT_VLLM_META, AVKIT_VLLM_FLUSH_S: plugin.py)
and vLLM's in-process engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0: vLLM's worker is this process, so the
plugin's Observer is this module's to finish). The plugin is registered here as vLLM registers it (its
`vllm.general_plugins` entry point, idempotent), so the checkout on PYTHONPATH is the one that runs.
  SPEC    the engine (child.make_llm's keys) and `requests`: request_id, dataset, prompt_ids, temperature,
          top_p, max_tokens, seed, stop_token_ids; each request's id and dataset travel in its
          `SamplingParams.extra_args`, where the plugin reads them
  run     one `LLM.generate` over every request: vLLM's scheduler admits up to max_num_seqs at a time
  RESULT  vLLM's version, the dtype it ran, when the engine was ready (epoch s), generate seconds, whether
          cpu_fix ran, and its spec-decode counters (child.counters), written once the plugin closed both tables
Any failure: the traceback on stderr, exit code 1 (the tables hold what the plugin flushed).
"""

from __future__ import annotations

import json
import os
import sys
import time

import vllm
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from avkit.engines.vllm import cpu_fix, plugin
from avkit.engines.vllm.child import counters, die_with_parent, make_llm


def sampling_params(req: dict):
    """A request of the spec -> vLLM's SamplingParams (the plugin's labels in `extra_args`)."""
    t = float(req["temperature"])
    return SamplingParams(temperature=t, top_p=float(req["top_p"]) if t > 0 else 1.0,
                          max_tokens=int(req["max_tokens"]), seed=req.get("seed"),
                          stop_token_ids=list(req.get("stop_token_ids", ())), detokenize=False,
                          extra_args={"avkit_request_id": req["request_id"], "avkit_dataset": req["dataset"]})


def main(spec_path: str, result_path: str) -> int:
    die_with_parent()
    spec = json.loads(open(spec_path).read())
    plugin.register()
    llm = make_llm(spec)
    fixed = cpu_fix.install()  # after the engine: vLLM registers its CPU kernels while it starts
    ready_at = time.time()
    dtype = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    meta = json.loads(os.environ.get(plugin.META, "") or "{}")  # read when the plugin opens the trace
    os.environ[plugin.META] = json.dumps({**meta, "avkit.dtype": dtype,
                                          "avkit.vllm.cpu_expand_fix": str(fixed).lower()})
    reqs = spec["requests"]
    t1 = time.perf_counter()
    llm.generate([TokensPrompt(prompt_token_ids=list(r["prompt_ids"])) for r in reqs],
                 [sampling_params(r) for r in reqs], use_tqdm=True)
    generate_s = time.perf_counter() - t1
    plugin.finish()
    with open(result_path, "w") as fh:
        json.dump({"vllm": vllm.__version__, "dtype": dtype, "ready_at": ready_at, "generate_s": generate_s,
                   "cpu_expand_fix": fixed, "counters": counters(llm)}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
