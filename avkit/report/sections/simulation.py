"""Simulation: throughput vs concurrency and the throughput-interactivity Pareto front for
no-spec, each fixed K and adaptive, from `avkit simulate` results (avkit/sim/replay.py).

Interactivity is tokens/s per request (what one user sees); throughput is tokens/s of the whole
batch. A (policy, concurrency) point is on the Pareto front when no other point of a deployable
policy is at least as good on both and better on one; the oracle (it reads the recorded outcomes)
is an upper bound, drawn for reference and never on the front.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from avkit.report import plots
from avkit.report.document import Figure, Section, Table, grid_table, record_table
from avkit.report.inputs import ReportInputs
from avkit.sim.replay import deployable


def pareto_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[N] True where no other point has x' >= x and y' >= y with one of them strict (O(N^2), N small).

    Examples
    --------
    >>> pareto_mask(np.array([1.0, 2.0, 1.5, 3.0]), np.array([3.0, 2.0, 1.0, 0.5])).tolist()
    [True, True, False, True]
    """
    ge = (x[None, :] >= x[:, None]) & (y[None, :] >= y[:, None])  # [N, N] j weakly dominates i
    gt = (x[None, :] > x[:, None]) | (y[None, :] > y[:, None])
    return ~(ge & gt).any(axis=1)


def _series(df: pl.DataFrame, x: str, y: str = "throughput_tok_s") -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return plots.series(df.iter_rows(named=True), "policy", x, y)  # (df: sorted by concurrency)


def throughput_figure(df: pl.DataFrame):
    """Throughput per policy over concurrency (log-log, left) and against the best fixed K there (right), where the
    policies' differences are visible."""
    fig, left, right = plots.throughput_panels((12.0, 4.6), _series(df, "concurrency"),
                                               _series(df, "concurrency", "vs_best_fixed"),
                                               "concurrency (requests decoding at once)")
    left.set(title="Simulated throughput vs concurrency", ylabel="throughput (tokens/s, all requests)")
    right.set(title="Relative to the best fixed K (no-spec is far below)", ylabel="throughput / best fixed K (×)")
    handles, labels = left.get_legend_handles_labels()  # every policy, no-spec (grey dotted) included
    fig.legend(handles, labels, frameon=False, fontsize=7, loc="outside right center")
    return fig


def main_adaptive(df: pl.DataFrame) -> str | None:
    """The first adaptive policy that does not peek at outcomes (oracle)."""
    return next((p for p in dict.fromkeys(df["policy"].to_list()) if p.startswith("adaptive") and "oracle" not in p),
                None)


def _headline(df: pl.DataFrame) -> str:
    main = main_adaptive(df)
    if main is None:
        return "No adaptive policy in these results."
    part = df.filter(pl.col("policy") == main).sort("concurrency")
    cells = ", ".join(f"c{c}: {v:.2f}×" for c, v in zip(part["concurrency"], part["vs_best_fixed"]))
    return (f"{main} against the best fixed K at each concurrency (throughput ratio): {cells}. "
            "For comparison, the DeepSeek-V4 ROCm table of vLLM's Adaptive Verification docs (seed 000, "
            "docs/seeds.md): adaptive 5–8% below fixed K = 7 at c ≤ 32, "
            "+6% at c64, +18% at c128, +70% at c256.")


def policy_tables(df: pl.DataFrame) -> list[Table]:
    """Policy x concurrency: throughput (tok/s) and its ratio to the best fixed K; best per column in bold."""
    conc = sorted(set(df["concurrency"].to_list()))
    policies = list(dict.fromkeys(df["policy"].to_list()))
    cell = {(r["policy"], r["concurrency"]): r for r in df.iter_rows(named=True)}
    bound = set(df.filter(pl.Series(~deployable(df)))["policy"].to_list())  # the oracle: never "best"
    best = {c: max((cell[p, c]["throughput_tok_s"] for p in policies if (p, c) in cell and p not in bound),
                   default=None) for c in conc}
    bold = frozenset((i, j + 1) for i, p in enumerate(policies) for j, c in enumerate(conc)
                     if (p, c) in cell and cell[p, c]["throughput_tok_s"] == best[c])
    captions = ("Simulated throughput, tokens/s; bold: the best deployable policy at that concurrency (the oracle "
                "is an upper bound).",
                "Throughput relative to the best fixed K at that concurrency (×).")
    return [grid_table({key: r[col] for key, r in cell.items()}, "policy", policies, conc, digits,
                       col_head=lambda c: f"c={c}", emphasis=bold, caption=caption)
            for (col, digits), caption in zip((("throughput_tok_s", 0), ("vs_best_fixed", 3)), captions)]


DETAIL = (("concurrency", "concurrency", 0), ("policy", "policy", None), ("throughput (tok/s)", "throughput_tok_s", 0),
          ("per request (tok/s)", "per_request_tok_s", 1), ("tokens / step", "tokens_per_step", 2),
          ("verified / step", "verified_per_step", 2), ("wasted drafts", "drafts_wasted", 3),
          ("× best fixed K", "vs_best_fixed", 3), ("× no-spec", "vs_nospec", 3), ("Pareto", "pareto", None))


def detail_table(df: pl.DataFrame, front: np.ndarray) -> Table:
    cols = [c for c in DETAIL if c[1] in df.columns or c[1] == "pareto"]
    return record_table([r | {"pareto": "yes" if f else ""} for r, f in zip(df.iter_rows(named=True), front)], cols,
                        collapsed=True, numeric=(True, False) + (True,) * (len(cols) - 3) + (False,),
                        caption="Every simulated (concurrency, policy) pair.")


def title(cost: dict | None) -> str:
    """The section title; a roofline cost model is a what-if on other hardware, and the title says so."""
    if cost and cost.get("source") == "roofline":
        return (f"Simulation, a what-if on a {cost.get('device', '?')} roofline ({cost.get('target', '?')} target): "
                "throughput and interactivity")
    return "Simulation: throughput and interactivity"


def build(inputs: ReportInputs) -> Section:
    sec, df = Section("simulation", title((inputs.records.get("sim") or {}).get("cost"))), inputs.sim
    if df is None:
        return sec.omit(inputs.notes.get("sim", "no simulation results"))
    df = df.sort("concurrency", maintain_order=True)
    runnable = deployable(df)  # [N] the front is over policies one can run, the oracle is a bound
    front = np.zeros(df.height, bool)
    front[runnable] = pareto_mask(df["per_request_tok_s"].to_numpy()[runnable],
                                  df["throughput_tok_s"].to_numpy()[runnable])
    bounds = frozenset(df.filter(pl.Series(~runnable))["policy"].to_list())
    sec.add(f"Source: {inputs.sources.get('sim', '?')}. " + _headline(df)
            + (" adaptive-oracle verifies with confidences that know the recorded outcomes: an upper bound, "
               "not a deployable policy." if "adaptive-oracle" in df["policy"].to_list() else ""))
    sec.add(Figure("throughput_vs_concurrency", "Simulated throughput per policy across concurrency: "
                   "absolute (left, log-log) and against the best fixed K at each concurrency (right).",
                   throughput_figure(df),
                   alt="throughput vs concurrency"))
    sec.add(*policy_tables(df))
    pts = (df["per_request_tok_s"].to_numpy()[front], df["throughput_tok_s"].to_numpy()[front])
    on_front = df.filter(pl.Series(front))
    sec.add(Figure("pareto", "Throughput against per-request speed; each policy's line runs over concurrency. "
                   "The black step line and circles are the Pareto front of the deployable policies"
                   + (f"; {', '.join(sorted(bounds))} (dashed grey) reads the recorded outcomes, an upper bound "
                      "drawn for reference and left off the front." if bounds else "."),
                   plots.pareto(_series(df, "per_request_tok_s"), pts,
                                {p: x for p, (x, _) in _series(df, "concurrency").items()}, main_adaptive(df),
                                bounds),
                   alt="throughput-interactivity Pareto front"))
    sec.add("On the Pareto front of deployable policies: " + ", ".join(f"{p} @ c{c}" for p, c in zip(on_front["policy"],
                                                                              on_front["concurrency"])) + ".")
    return sec.add(detail_table(df, front))
