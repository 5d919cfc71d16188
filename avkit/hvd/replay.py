"""Trace replay for Hybrid Verified Decoding (docs/hvd.md "Training by trace replay").

For every position t of every recorded generation the replay rebuilds the suffix cache as it stood
(prompt + output[:t] in the request's local tree, earlier responses in the global tree), drafts from it,
and compares the draft with the target's continuation output[t:]:
  cache_acc[t]  oracle accepted length = common prefix of the cache draft and output[t:]
  match[t]      the draft model's argmax given prompt + output[:t] equals output[t] (teacher-forced)
  model_acc[t]  accepted length of a K-token model draft at t under greedy verification:
                min(K, run of True in match[t:])
Rows: one per (request, t) with the features of `avkit.hvd.features`.

match[] comes from one teacher-forced draft forward per generation (`matches_from_draft`) or from the greedy
trace itself (`matches_from_trace`): within a step drafted at output offset o, slot j's token is the
teacher-forced argmax at o + j as long as slots < j matched. Positions no step labels (the bonus token after
a fully accepted step, steps without drafts) are filled with True (the fraction is reported).

`synthetic_generations` (`avkit hvd --synthetic`, tests): outputs built from spans: prompt copies, copies of a
boilerplate pool shared across requests, fresh random tokens, and copies with one token changed midway; the
model's teacher-forced matches are iid Bernoulli(`model_rate`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from avkit.config import HvdReplayConfig, SuffixCacheConfig
from avkit.errors import ConfigError, TraceError
from avkit.hvd.features import RequestFeatures, accept_lengths, columns
from avkit.hvd.suffix_cache import SuffixCache, common_prefix
from avkit.trace.reader import read_generations, read_traces, trace_metadata
from avkit.trace.schema import generations_path
from avkit.trace.shards import shipped_traces


@dataclass(frozen=True)
class ReplayGeneration:
    request_id: str
    dataset: str
    prompt_ids: list[int]
    output_ids: list[int]
    model_match: np.ndarray  # [N] bool, draft argmax == output[t] teacher-forced


def matches_from_draft(draft, prompt_ids: list[int], output_ids: list[int]) -> np.ndarray:
    """One teacher-forced forward of a loaded draft model (`avkit.models.LoadedModel`) -> [N] bool."""
    model = draft.model
    ids = list(prompt_ids) + list(output_ids)
    cache = model.new_cache(1, len(ids))
    tokens = torch.tensor([ids], dtype=torch.int64)  # [1, S]
    with torch.inference_mode():
        logits = model.forward(tokens, torch.tensor([len(ids)]), torch.tensor([0]), cache, logits="all")
    p = len(prompt_ids)
    pred = logits[0, p - 1: p - 1 + len(output_ids)].argmax(-1).numpy()  # [N] prediction of output[t]
    return pred == np.asarray(output_ids)


def _label_rows(rows: pl.DataFrame, outputs: dict[str, np.ndarray], base: int) -> pl.DataFrame:
    """Per draft slot: absolute position pos, eq (draft == output), valid (all earlier slots matched). A step's
    output offset is base + step + the accepted tokens of the earlier steps (a step without draft rows still
    emitted one token, which `step` counts)."""
    off = (rows.group_by("request_id", "step").agg(pl.col("num_accepted").first()).sort("request_id", "step")
           .with_columns((base + pl.col("step") + pl.col("num_accepted").cum_sum().over("request_id")
                          - pl.col("num_accepted")).alias("offset")))
    df = rows.join(off.select("request_id", "step", "offset"), on=["request_id", "step"])
    df = df.with_columns((pl.col("offset") + pl.col("position")).alias("pos")).sort("request_id", "step", "position")
    out_tok = np.full(df.height, -1, dtype=np.int64)
    rid, pos = df["request_id"].to_numpy(), df["pos"].to_numpy()
    for r in np.unique(rid):
        sel = np.flatnonzero(rid == r)
        o = outputs[r]
        inside = (pos[sel] >= 0) & (pos[sel] < len(o))
        out_tok[sel[inside]] = o[pos[sel[inside]]]
    df = df.with_columns(eq=pl.Series(df["draft_token"].to_numpy() == out_tok))
    # valid: every earlier slot of the same step matched (the draft still sat on the target's prefix)
    miss_before = (~pl.col("eq")).cast(pl.Int32).cum_sum().over("request_id", "step") - (~pl.col("eq")).cast(pl.Int32)
    return df.with_columns(valid=(miss_before == 0) & (pl.Series(out_tok) >= 0))


def matches_from_trace(trace: pl.DataFrame, gens: pl.DataFrame) -> tuple[dict[str, np.ndarray],
                                                                         dict[str, np.ndarray]]:
    """Model-drafter rows of a greedy trace + its generations -> (match, known): {request_id: [N] bool}
    each; positions no step labels are unknown and their match is filled with True.

    The first drafted step's offset (0, 1 when the prefill token precedes it, or -1) is detected from
    which one makes accepted draft tokens agree with the output."""
    rows = trace.filter(pl.col("drafter") == "model").select(  # the reader checked the columns
        "draft_token", "num_accepted", "position", pl.col("request_id").cast(pl.String), "step")
    outputs = {r: np.asarray(o, dtype=np.int64) for r, o in zip(gens["request_id"], gens["output_ids"])}
    rows = rows.filter(pl.col("request_id").is_in(list(outputs)))
    agree = lambda lab: (lab.filter(pl.col("position") < pl.col("num_accepted"))["eq"].mean() or 0.0
                         if lab.height else 1.0)  # accepted draft tokens that equal the output
    lab = max((_label_rows(rows, outputs, base) for base in (0, 1, -1)), key=agree).filter(pl.col("valid"))
    match = {r: np.ones(len(o), dtype=bool) for r, o in outputs.items()}
    known = {r: np.zeros(len(o), dtype=bool) for r, o in outputs.items()}
    for (r,), grp in lab.group_by("request_id"):
        p = grp["pos"].to_numpy()
        match[r][p] = grp["eq"].to_numpy()
        known[r][p] = True
    return match, known


def replay(gens: list[ReplayGeneration], cache_config: SuffixCacheConfig = SuffixCacheConfig(),
           config: HvdReplayConfig = HvdReplayConfig(), classes: np.ndarray | None = None,
           progress: bool = False) -> pl.DataFrame:
    """One row per (request, position) in generation order; the global tree fills in that order. Each
    generation is walked token by token: draft, take the features, score the draft against output[t:],
    then append output[t]."""
    from rich.progress import track  # lazy: rich (progress bar only on a terminal)

    cache = SuffixCache(cache_config)
    frames = []
    for gen in track(gens, description="hvd replay", transient=True) if progress else gens:
        out, n, k = gen.output_ids, len(gen.output_ids), config.k
        if n == 0:
            continue
        model_match = np.asarray(gen.model_match, dtype=bool)  # [N]
        state = RequestFeatures(gen.prompt_ids, k, config.history_window, classes)
        rows, cache_acc = [], np.zeros(n, dtype=np.int64)  # [N]
        cache.start_request(gen.request_id, gen.prompt_ids)
        for t in range(n):
            d = cache.draft(gen.request_id, k)
            rows.append(state.row(d))
            cache_acc[t] = common_prefix(d.tokens, out[t:t + d.draft_len])  # <= K compares
            cache.append(gen.request_id, [out[t]])
            state.append(out[t], d.tokens, bool(model_match[t]))
        cache.finish_request(gen.request_id)
        frames.append(pl.DataFrame({"request_id": [gen.request_id] * n, "dataset": [gen.dataset] * n,
                                    "t": np.arange(n), "model_acc": accept_lengths(model_match, k),
                                    "model_match": model_match, "cache_acc": cache_acc, **columns(rows)}))
    if not frames:
        raise TraceError("hvd replay: no generation with output tokens")
    return pl.concat(frames).with_columns(pl.col("draft_len", "match_len").cast(pl.Int64))


def load_generations(trace_paths: list[str | Path]) -> tuple[list[ReplayGeneration], dict]:
    """Generations beside each trace, with model matches from the trace. Returns (gens, info)."""
    gens: list[ReplayGeneration] = []
    info = {"unknown_model_positions": [], "temperatures": set()}
    for path in map(Path, trace_paths):
        table = read_generations(path)
        trace = read_traces([path], ["request_id", "step", "position", "draft_token", "num_accepted", "drafter",
                                     "temperature"]).with_columns(pl.col("request_id", "drafter").cast(pl.String))
        info["temperatures"] |= set(trace["temperature"].unique().to_list())
        match, known = matches_from_trace(trace, table)
        n_known = sum(int(k.sum()) for k in known.values())
        info["unknown_model_positions"].append(1.0 - n_known / max(sum(len(k) for k in known.values()), 1))
        for row in table.iter_rows(named=True):
            gens.append(ReplayGeneration(f"{path.stem}/{row['request_id']}", row["dataset"],
                                         list(row["prompt_ids"]), list(row["output_ids"]), match[row["request_id"]]))
    return gens, info


def greedy_traces(root: Path | None = None) -> list[Path]:
    """Shipped traces with a generations table beside them: those recorded at temperature 0, else all (sampled
    traces replay unbiased: a deterministic cache token x is accepted with probability p(x), the chance the
    recorded sample equals x; the temperatures used are reported)."""
    if root is None:  # where fit, simulate and report find them: ./traces, else beside the package
        try:
            root = shipped_traces()[0].parent
        except ConfigError:
            root = Path("traces")
    found = [p for p in sorted(root.glob("*.parquet"))
             if not p.name.endswith(".generations.parquet") and generations_path(p).is_file()]
    if not found:
        raise ConfigError(f"no trace with a generations table in {root}/; pass trace files or --synthetic")
    return [p for p in found if _recorded_greedy(p)] or found


def _recorded_greedy(path: Path) -> bool:
    with contextlib.suppress(ValueError):  # an unreadable temperature: not greedy
        return float(trace_metadata(path).get("avkit.temperature", "nan")) == 0.0
    return False


# dataset -> probabilities of span kinds (prompt copy, boilerplate copy, mutated copy, fresh)
PROFILES = {"code": (0.45, 0.2, 0.15, 0.2), "chat": (0.1, 0.05, 0.05, 0.8)}


def _output(rng, prompt: list[int], pool: list[list[int]], n: int, mix, vocab: int) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        kind = rng.choice(4, p=mix)
        span = int(rng.integers(3, 20))
        if kind == 3:
            out.extend(rng.integers(0, vocab, span).tolist())
            continue
        src = prompt if kind in (0, 2) else pool[int(rng.integers(len(pool)))]
        i = int(rng.integers(0, max(len(src) - span, 1)))
        piece = list(src[i:i + span])
        if kind == 2 and len(piece) > 2:
            piece[int(rng.integers(1, len(piece)))] = int(rng.integers(0, vocab))
        out.extend(piece)
    return out[:n]


def synthetic_generations(num_requests: int = 40, seed: int = 0, vocab: int = 500, prompt_len: int = 120,
                          output_len: int = 200, model_rate: float = 0.75) -> list[ReplayGeneration]:
    """Generations alternating between the `code` and `chat` profiles."""
    rng = np.random.default_rng(seed)
    pool = [rng.integers(0, vocab, 40).tolist() for _ in range(8)]
    gens = []
    for r in range(num_requests):
        dataset = ("code", "chat")[r % 2]
        prompt = rng.integers(0, vocab, prompt_len).tolist()
        out = _output(rng, prompt, pool, output_len, PROFILES[dataset], vocab)
        gens.append(ReplayGeneration(f"req{r}", dataset, prompt, out, rng.random(output_len) < model_rate))
    return gens
