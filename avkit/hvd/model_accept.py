"""The model drafter's accepted length at every decode position of a greedy generation (docs/hvd.md).

Glossary:
  match[t]    the draft model's argmax given prompt + output[:t] equals the target's output[t]
              (teacher-forced: the draft sees the target's own tokens)
  accept[t]   accepted length of a K-token model draft made at position t under greedy
              verification: its j-th token is accepted only if the earlier ones were, so
              accept[t] = min(K, run of consecutive True in match[t:])
Two sources for match[]: one teacher-forced draft forward per generation (`matches_from_draft`),
or the greedy trace itself (`matches_from_trace`): within a step drafted at output offset o, slot
j's token is the teacher-forced argmax at o + j as long as slots < j matched, so each step
labels positions o .. o + (first mismatch). Positions no step labels (the bonus token after a
fully accepted step, steps without drafts) are unknown and filled with True: the draft was on a
run of matches there (the fraction is reported).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from avkit.errors import TraceError


def accept_lengths(match: np.ndarray, k: int) -> np.ndarray:
    """[N] bool -> [N] int64: min(k, run of consecutive True starting at each t).

    >>> accept_lengths(np.array([True, True, False, True]), k=7).tolist()
    [2, 1, 0, 1]
    """
    n = len(match)
    idx = np.arange(n)
    # next_false[t] = first index >= t with match False (n if none): reverse running minimum
    stops = np.where(match, n, idx)
    next_false = np.minimum.accumulate(stops[::-1])[::-1]
    return np.minimum(next_false - idx, k).astype(np.int64)


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


def _step_offsets(rows: pl.DataFrame, base: int) -> pl.DataFrame:
    """Output offset of each (request, step): base + step + accepted tokens of the earlier steps.
    Steps without draft rows still emitted one token each, which `step` counts."""
    steps = (rows.group_by("request_id", "step").agg(pl.col("num_accepted").first())
             .sort("request_id", "step"))
    return steps.with_columns(
        (base + pl.col("step") + pl.col("num_accepted").cum_sum().over("request_id") - pl.col("num_accepted"))
        .alias("offset"))


def _label_rows(rows: pl.DataFrame, outputs: dict[str, np.ndarray], base: int) -> pl.DataFrame:
    """Per draft slot: absolute position, eq (draft == output), valid (all earlier slots matched)."""
    off = _step_offsets(rows, base)
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
    need = {"request_id", "step", "position", "draft_token", "num_accepted", "drafter"}
    missing = need - set(trace.columns)
    if missing:
        raise TraceError(f"trace: missing columns {sorted(missing)} needed for hybrid replay")
    rows = trace.filter(pl.col("drafter") == "model").select(sorted(need - {"drafter"})).with_columns(
        pl.col("request_id").cast(pl.String))
    outputs = {r: np.asarray(o, dtype=np.int64) for r, o in zip(gens["request_id"], gens["output_ids"])}
    rows = rows.filter(pl.col("request_id").is_in(list(outputs)))
    best = None
    for base in (0, 1, -1):
        lab = _label_rows(rows, outputs, base)
        agree = lab.filter(pl.col("position") < pl.col("num_accepted"))["eq"].mean() if lab.height else 1.0
        if best is None or (agree or 0.0) > best[0]:
            best = (agree or 0.0, lab)
    lab = best[1].filter(pl.col("valid"))
    match = {r: np.ones(len(o), dtype=bool) for r, o in outputs.items()}
    known = {r: np.zeros(len(o), dtype=bool) for r, o in outputs.items()}
    for (r,), grp in lab.group_by("request_id"):
        p = grp["pos"].to_numpy()
        match[r][p] = grp["eq"].to_numpy()
        known[r][p] = True
    return match, known
