"""`avkit profile --engine vllm`: vLLM's step costs on this device as a CostTable (the method: docs/vllm.md, "Step
costs"). Whole `LLMEngine.step()` calls of real requests are timed in vLLM's process (offline.py `profile`), split
by the hooks' drafting time; meta["points"] keeps every raw point (`table_from_points` refits them).
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from avkit.config import EngineConfig, ModelsConfig, ProfileConfig, RecordConfig
from avkit.engines.vllm.driver import child_env, engine_spec, exit_error, run_offline
from avkit.models.tokenizer import Tokenizer
from avkit.provenance import inputs_record
from avkit.scheduling.cost import CostTable, isotonic
from avkit.scheduling.cost import context_len_from_env
from avkit.scheduling.profile import noise_summary, request_grid

KV_CONTEXT_FACTOR = 2  # the target-only engine's second context, x context_len (kv_ms_per_token)


def profile_vllm(python: str, target, draft, config: ProfileConfig, *, dtype: str, threads: int,
                 on_point: Callable[[], None] | None = None) -> CostTable:
    """Measure vLLM's step costs (module docstring; the steps are timed in vLLM's process, offline.py's
    `profile` mode); `target`/`draft` are driver.hf_dir paths."""
    context = context_len_from_env(config.context_len)
    n_grid = request_grid(config.max_requests)  # requests per point, both engines
    steps = config.warmup + config.repeats
    vocab = min(Tokenizer.from_dir(target).vocab_size, json.loads((target / "config.json").read_text())["vocab_size"])
    max_new = (steps + 2) * (config.k + 1) + 2  # enough tokens for the steady steps even if every draft lands
    points, version = [], ""
    for k in spec_ks(config.k) + [0]:
        contexts = [context] if k else [context, KV_CONTEXT_FACTOR * context]
        rc = RecordConfig(models=ModelsConfig(target=str(target), draft=str(draft) if k else "none", dtype=dtype),
                          decoding=EngineConfig(k=k, concurrency=max(n_grid), seed=0),
                          sampling=replace(config.sampling, max_new_tokens=max_new), max_prompt_tokens=max(contexts),
                          threads=threads, engine="vllm", vllm_python=python)
        spec = {**engine_spec(rc, target, draft if k else target), "mode": "profile", "prefix_caching": False,
                "contexts": contexts, "requests": n_grid, "steps": steps, "vocab": vocab, "max_tokens": max_new,
                "temperature": config.sampling.temperature, "top_p": config.sampling.top_p}
        with tempfile.TemporaryDirectory(prefix="avkit-vllm-profile-") as work:
            code, lines = run_offline(python, spec, child_env(threads), Path(work), progress=False,
                                      on_line=lambda line: on_point and "steady" in line and on_point())
            if code != 0:
                log = Path(tempfile.mkdtemp(prefix="avkit-vllm-")) / "vllm.log"
                raise exit_error(code, Path(shutil.copy(Path(work) / "vllm.log", log)))
        version = lines[-1]["vllm"]
        for line in lines[:-1]:
            runs = line["steady"][config.warmup:]
            n = line["requests"]
            points.append({"k": k, "requests": n, "tokens": n * (k + 1), "context": line["context"],
                           "step_ms": [r[0] for r in runs], "draft_ms": [r[1] for r in runs],
                           "verify_ms": [r[0] - r[1] for r in runs]})
    meta = {"source": "profile", "engine": f"vllm {version}", "device": f"vllm {version} cpu x{threads or 'all'} threads",
            "target": str(target), "draft": str(draft) if config.k else "", "context_len": context, "k": config.k,
            "temperature": config.sampling.temperature, "top_p": config.sampling.top_p, "repeats": config.repeats, "dtype": dtype,
            "vllm_draft_sampling": rc.vllm_draft_sampling, "inputs": inputs_record("avkit profile --engine vllm")}
    return table_from_points(points, n_grid, meta)


def table_from_points(points: list[dict], n_grid: list[int], meta: dict) -> CostTable:
    """The cost table of a profile's raw points (meta["points"] of a saved table: it can be fitted again)."""
    context = int(meta.get("context_len", 0))
    kv = fit_kv(points, context)
    points_at = [p for p in points if p.get("context", context) == context]  # the curves' points
    verify = {}  # T -> point (engines run largest K first: its layout wins a tie)
    for p in points_at:
        verify.setdefault(p["tokens"], p)
    t_grid = sorted(verify)
    verify_runs = [verify[t]["verify_ms"] for t in t_grid]
    verify_ms = [statistics.median(r) for r in verify_runs]
    draft_ms, fixed_ms, draft_runs, phi = fit_drafting(points_at, n_grid)
    meta = {**meta, "raw_verify_ms": verify_ms, "raw_draft_ms": draft_ms, "raw_draft_fixed_ms": fixed_ms,
            "draft_fixed_passes": phi, "points": points,
            "noise": noise_summary({"verify_ms": (t_grid, verify_runs), "draft_ms": (n_grid, draft_runs)})}
    return CostTable(tuple(t_grid), tuple(isotonic(verify_ms).tolist()), tuple(n_grid), tuple(isotonic(draft_ms).tolist()),
                     (), "autoregressive", meta, tuple(isotonic(fixed_ms).tolist()) if phi > 0 else (),
                     context_len=context, kv_ms_per_token=kv, noise=meta["noise"].pop("points"))


def fit_kv(points: list[dict], context: int) -> float:
    """ms per cached context token (module docstring) from the target-only points at two contexts (0 without)."""
    at = {(p["requests"], p.get("context", context)): statistics.median(p["step_ms"]) for p in points if p["k"] == 0}
    per_n = [(at[n, c] - at[n, context]) / (n * (c - context)) for n, c in at if c > context and (n, context) in at]
    return max(0.0, statistics.median(per_n)) if per_n else 0.0


def spec_ks(k: int) -> list[int]:
    """The speculative engines a profile runs, largest first: K and K // 2 (when that is >= 1)."""
    return [x for x in (k, k // 2) if x > 0]


def fit_drafting(points: list[dict], n_grid: list[int]) -> tuple[list[float], list[float], list[list[float]], float]:
    """-> (draft_ms, draft_fixed_ms per request count n, the runs behind draft_ms, phi) from the spec points'
    drafting times D(n, K) = (K + phi) draft_ms(n): one phi for all n, the median over n of the phi that fits both
    Ks' medians at n, clipped at 0 (a line per n doubles the noise in its intercept: docs/vllm.md). One K: phi 0.

    Examples
    --------
    >>> pts = [{"k": 7, "requests": 1, "draft_ms": [800.0]}, {"k": 3, "requests": 1, "draft_ms": [400.0]}]
    >>> fit_drafting(pts, [1])[:2] + fit_drafting(pts, [1])[3:]
    ([100.0], [100.0], 1.0)
    >>> fit_drafting(pts[:1], [1])[:2]
    ([114.28571428571429], [0.0])
    """
    spec = [p for p in points if p["k"] > 0]
    if not spec:
        return [0.0] * len(n_grid), [0.0] * len(n_grid), [[0.0]] * len(n_grid), 0.0
    by_n = {n: sorted((p for p in spec if p["requests"] == n), key=lambda p: -p["k"]) for n in n_grid}
    phis = []
    for mine in by_n.values():
        if len(mine) > 1:
            (k, d), (k2, d2) = ((p["k"], statistics.median(p["draft_ms"])) for p in mine[:2])
            if d > d2:  # (K + phi) / (K2 + phi) = D / D2
                phis.append((d2 * k - d * k2) / (d - d2))
    phi = max(statistics.median(phis), 0.0) if phis else 0.0
    slopes, runs = [], []
    for n in n_grid:
        hi = by_n[n][0]
        slopes.append(statistics.median(hi["draft_ms"]) / (hi["k"] + phi))
        runs.append([d / (hi["k"] + phi) for d in hi["draft_ms"]])
    return slopes, [phi * x for x in slopes], runs, phi


def num_points(config: ProfileConfig) -> int:
    return len(request_grid(config.max_requests)) * (len(spec_ks(config.k)) + 2)  # + the long-context K = 0 run
