"""An `HvdResult` as text: paragraphs and tables (`hvd_blocks`), rendered to Markdown here (`avkit hvd --markdown`,
bench/results/hvd.md) and into the report's hybrid section (report/sections/hybrid.py)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from avkit.hvd import METRICS, PAPER, SPEEDUPS
from avkit.hvd.cost import LINEAR
from avkit.hvd.fit import HvdResult, result_json
from avkit.hvd.router import MODEL_SCALES
from avkit.hvd.verdict import FLOOR, HVD, SINGLE
from avkit.markdown import fmt, md_table

COLS = ("router", "dataset", "tokens", *METRICS, *SPEEDUPS, "c_draft", "c_verify")


def cost_md(cost: dict) -> str:
    """The replay's cost model in words (every speedup in these tables assumes it)."""
    table = cost.get("table") or {}
    if table and table.get("meta", {}).get("source") != LINEAR:  # a measured table, in target forwards
        v = ", ".join(f"{x:g}: {y:.2f}" for x, y in zip(table["verify_tokens"], table["verify_ms"]))
        fixed = table.get("draft_fixed_ms") or [0.0] * len(table["draft_ms"])
        d = ", ".join(f"{x:g}: {y + f:.2f}" for x, y, f in zip(table["draft_requests"], table["draft_ms"], fixed))
        return (f"Cost model (units of one target forward over one token), measured: {cost.get('source', '')}. "
                f"A target forward over T tokens costs verify(T) {{{v}}}; one draft-model step over n requests "
                f"costs draft(n) {{{d}}} (interpolated; c_verify = {cost['verify_token_cost']:.3f} per token over "
                f"1-8 tokens, c_draft = {cost['draft_step_cost']:.3f} for one request); a cache lookup + payoff "
                f"prediction costs c_cache = {cost['cache_cost']}. A step of N requests costs "
                f"verify(N + verified) + K draft(requests drafting with the model) + c_cache per request that "
                f"consulted the cache; throughput = tokens / cost (target-only decoding = 1).")
    return (f"Cost model (units of one target forward): a draft-model step costs c_draft = "
            f"{cost['draft_step_cost']}, each verified token adds c_verify = {cost['verify_token_cost']} to the "
            f"target forward, a cache lookup + payoff prediction costs c_cache = {cost['cache_cost']}. A cycle "
            f"costs 1 + c_verify (1 + verified) + c_draft K when the draft model ran + c_cache when the cache "
            f"was consulted (a batched step: c_cache per request that consulted it); throughput = tokens / cost (target-only decoding = 1).")


VERDICT_COLS = ("dataset", "requests", *SINGLE, *HVD, "best_single_router", "best_router", "ratio", "fewer_cycles",
                "holds", "oracle", "headroom", "oracle_fewer_cycles")


def cells(records: list[dict], cols: tuple[str, ...] | None = None):
    """The columns of `cols` (None: all) the records hold, each record's cells (`fmt`, 3 decimals) and per column
    whether it is numeric (right-aligned): the tables of `avkit hvd` (terminal and --markdown) and of the report."""
    cols = tuple(c for c in (cols or records[0]) if c in records[0])
    return (cols, [[fmt(r[c], 3) for c in cols] for r in records],
            [not isinstance(records[0][c], str | bool) for c in cols])


def thresholds_md(thresholds: dict[str, float], info: dict) -> str:
    """The routers' thresholds tau chosen on validation, and the joint router's model survival scale."""
    return ("Thresholds: " + ", ".join(f"{k} tau={fmt(v, 3)}" for k, v in thresholds.items())
            + (f"; joint router's model survival scale {info['model_scale']} (validated over "
               f"{', '.join(map(str, MODEL_SCALES))})" if info.get("model_scale") is not None else ""))


def facts_md(info: dict) -> str:
    """What the replay rests on: its size, split and data, the recording temperatures, the unlabelled positions."""
    text = (f"Replay: {info['requests']} requests, {info['rows']} decode positions ({info['rows_with_cache_draft']} "
            f"with a cache draft, mean draft length {info['mean_cache_draft_len']:.2f}, {info['high_payoff_rate']:.1%} "
            f"of them accepted >= {info['high_payoff']}) in {info.get('replay_s', '?')} s; split by request "
            f"{info['split_requests']}; metrics on the **test** requests, thresholds chosen on validation. "
            f"K = {info['k']}; mean oracle cache accepted length {info['mean_cache_acc']:.3f}, model "
            f"{info['mean_model_acc']:.3f} (all positions).")
    if info.get("temperatures"):
        text += (f" Recording temperature(s): {info['temperatures']} (sampled continuations give unbiased draws of a "
                 "deterministic cache draft's accepted length; see `greedy_traces` in `avkit/hvd/replay.py`).")
    if info.get("unknown_model_positions"):
        unknown = ", ".join(f"{u:.1%}" for u in info["unknown_model_positions"])
        text += (" Model-drafter matches come from the trace's own draft tokens; positions no step labels "
                 f"(bonus tokens) are counted as hits: {unknown} of positions.")
    return text


@dataclass(frozen=True)
class HvdTable:
    key: str  # overall, per_dataset, verdict, budget, ablation
    title: str
    text: str  # what the columns mean (Markdown: the paragraph under the title; report: the caption)
    records: list[dict]
    cols: tuple[str, ...] | None = None  # None: every column


def hvd_blocks(blob: dict, sensitivity: bool = False) -> list[str | HvdTable]:
    """hvd_metrics.json's content (`result_json`) as paragraphs and tables, in reading order; `sensitivity`: only
    what a cost-sensitivity section repeats (the cost model, the overall table, thresholds and verdict)."""
    info, rows, verdict = blob["info"], blob["metrics"], blob.get("verdict", [])
    overall = HvdTable("overall", "Overall (test split)", (
        "cycles_per_1k: target verifications per 1000 generated tokens; mean_accepted: accepted draft tokens per "
        f"cycle; cache_share: cycles that verified a cache draft; precision / recall: predicted payoff >= "
        f"{info['high_payoff']} against the oracle accepted length >= {info['high_payoff']} over positions with a "
        "cache draft (table, mlp, survival; the other routers by their decision); speedups are throughput ratios "
        "under the cost model (target-only decoding = 1)."), [r for r in rows if r["dataset"] == "overall"], COLS)
    thresholds = thresholds_md(blob.get("thresholds", {}), info)
    verdict_blocks = [HvdTable("verdict", f"Best HVD router vs the best single drafter (goal >= {FLOOR}x on every "
                               "dataset)", (
        "Each dataset's test requests decoded one at a time (`avkit/hvd/verdict.py`), every router under the same "
        "accounting; throughput in tokens per target forward. `survival+budget` is the joint router the live "
        "`--drafter hybrid --payoff payoff_survival.pt` runs. `oracle`: a clairvoyant router that knows both drafts' "
        "accepted lengths and verifies exactly what will be accepted (an upper bound for any router with these "
        "drafts at this K and cost model); `headroom` = oracle / the best single drafter, `oracle_fewer_cycles` its "
        "cycle saving against that drafter."), verdict, VERDICT_COLS),
        f"Best HVD router >= {FLOOR}x the best single drafter on {sum(r['holds'] for r in verdict)}/{len(verdict)} "
        "datasets."] if verdict else []
    if sensitivity:
        return [cost_md(info["cost"]), overall, thresholds, *verdict_blocks]
    mse = ", ".join(f"{k} {v:.3f}" for k, v in info.get("val_mse", {}).items())
    per_dataset = sorted((r for r in rows if r["dataset"] != "overall"), key=lambda r: (r["dataset"], r["router"]))
    blocks = [facts_md(info), cost_md(info["cost"]), overall,
              HvdTable("per_dataset", "Per dataset", "The same columns per dataset.", per_dataset, COLS), thresholds]
    if mse:
        blocks.append(f"Validation MSE of the predicted cache accepted length (positions with a cache draft): {mse}")
    blocks += verdict_blocks
    if blob.get("budget"):
        blocks.append(HvdTable("budget", "One verification budget (batched replay, throughput in tokens per target "
                               "forward)", (
            "Test requests decode `concurrency` at a time (at most the number of test requests). `survival+budget`: "
            "each step the batch either runs the draft model (each request then takes whichever draft, cache or "
            "model, has the larger expected accepted length) or not (cache drafts only), and all chosen slots compete "
            "for one budget b* = argmax E(b)/cost(b) over their survival curves (`avkit/hvd/joint.py`); the other "
            "routers verify every drafted slot, the draft model's cost being shared by the batch."),
            # one row per concurrency, a column per router
            pl.DataFrame(blob["budget"]).pivot(on="router", index="concurrency", values="throughput").to_dicts()))
    if blob.get("ablation"):
        blocks.append(HvdTable("ablation", "Feature ablation (mlp router)", "Validation MSE and test throughput of "
                               "the mlp router on each feature set.", blob["ablation"]))
    return blocks


def _markdown(blocks: list[str | HvdTable], level: str = "##") -> list[str]:
    return [line for b in blocks for line in ([b, ""] if isinstance(b, str) else
            [f"{level} {b.title}", "", b.text, "", md_table(*cells(b.records, b.cols)), ""])]


def hvd_markdown(result: HvdResult, title: str | None, notes: str = "",
                 others: dict[str, HvdResult] | None = None) -> str:
    """The report of one fit (`title` None: no title line); `others`: the same replay fitted under other cost
    models, each a cost-sensitivity section (its overall table, thresholds and verdict)."""
    parts = [*([f"# {title}", ""] if title else []), notes, "", *_markdown(hvd_blocks(result_json(result)))]
    for name, res in (others or {}).items():
        parts += [f"## Cost sensitivity: {name}", "", *_markdown(hvd_blocks(result_json(res), True), "###")]
    return "\n".join(parts + [f"Reference: {PAPER}.", ""])
